"""Progress of a long phase of a command on stderr: a rich bar with the time left on a terminal; otherwise (a pipe, a
CI log) plain lines, one per tenth of the work, once the phase has run for PLAIN_AFTER_S — short runs print
nothing. Used by ``ampe search`` (searching, energy planning) and ``ampe evaluate`` (costing many strategies)."""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any

PLAIN_AFTER_S = 5.0  # short phases print no progress lines


class PhaseProgress:
    """``with PhaseProgress("ampe search", "energy planning") as p: ... p.update(done, total)``. ``unit``: what
    ``done``/``total`` count (shown as ``3/10 groups``); None shows a percentage (estimated work, such as
    node-steps, means nothing to a reader)."""

    def __init__(self, command: str, what: str, unit: str | None = None, tty: bool | None = None) -> None:
        self.command, self.what, self.unit = command, what, unit
        self.tty = sys.stderr.isatty() if tty is None else tty
        self._bar: Any = None
        self._task: Any = None
        self._t0 = time.monotonic()
        self._shown = 0
        self.closed = False

    def __enter__(self) -> PhaseProgress:
        self._t0 = time.monotonic()
        return self

    def _start_bar(self, total: float) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        count = ("{task.completed:.0f}/{task.total:.0f} " + self.unit) if self.unit else "{task.percentage:>3.0f}%"
        self._bar = Progress(TextColumn(self.what), BarColumn(), TextColumn(count), TimeElapsedColumn(),
                             TextColumn("left"), TimeRemainingColumn(), transient=True,
                             console=Console(file=sys.stderr))
        self._task = self._bar.add_task(self.what, total=total)
        self._bar.__enter__()

    def __exit__(self, kind: type[BaseException] | None = None, exc: BaseException | None = None,
                 tb: TracebackType | None = None) -> None:
        self.close()

    def close(self) -> None:
        """End the bar (a terminal shows one live bar at a time: the next phase's starts after this)."""
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None
        self.closed = True

    def update(self, done: float, total: float) -> None:
        """``done`` of ``total`` units of work are finished (the bar starts on the first update)."""
        if self.closed:
            return
        if self.tty and self._bar is None:
            self._start_bar(total)
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=total)
            return
        tenth = int(done * 10 // total) if total > 0 else 10
        spent = time.monotonic() - self._t0
        if (tenth > self._shown or done >= total) and spent >= PLAIN_AFTER_S:
            self._shown = tenth
            left = spent / done * (total - done) if done > 0 else 0.0
            count = f"{done:.0f}/{total:.0f} {self.unit}" if self.unit else \
                f"{100 * done / total if total > 0 else 100:.0f}%"
            print(f"{self.command}: {self.what} {count}, {spent:.1f} s, about {left:.0f} s left", file=sys.stderr,
                  flush=True)
