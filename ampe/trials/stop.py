"""Stopping a run of trials on SIGINT/SIGTERM without losing a record (:class:`StopRequests`)."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any


class StopRequests:
    """While trials run, SIGINT and SIGTERM only record that a stop was asked for — any number of them, in any order
    — so no signal can interrupt the runner between killing a trial and writing its record. The runner polls
    :attr:`requested`, kills the running trial, records it as ``interrupted`` and stops. Off the main thread (where
    Python cannot install handlers) it never reports a request."""

    def __init__(self) -> None:
        self.signals: list[int] = []
        self._requested = False
        self._old: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        """True once SIGINT or SIGTERM arrived."""
        return self._requested

    def wait(self, seconds: float) -> None:
        """Sleep ``seconds`` (one poll interval) unless a stop was already requested."""
        if not self._requested:
            time.sleep(seconds)

    def _handler(self, signum: int, frame: object) -> None:
        # No lock here (an Event would take one): the handler runs on the main thread between any two bytecodes,
        # possibly while that thread holds the very lock, and a second signal would deadlock the runner.
        self.signals.append(signum)
        self._requested = True

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        # Once a stop was asked for, the process is on its way out: later signals are ignored rather than turned
        # back into a KeyboardInterrupt that would cut the shutdown (and its exit status) short.
        for sig, old in self._old.items():
            signal.signal(sig, signal.SIG_IGN if self.requested else old)
        self._old.clear()
