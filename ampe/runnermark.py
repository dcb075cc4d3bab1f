"""The mark a trial runner leaves in the environment of every process it starts, and the rank's watchdog on it.

``AMPE_TRIAL_RUNNER=RUNNER_PID:RUNNER_START:FOLDER``: the runner's pid, its start time in clock ticks since boot
(``/proc/PID/stat`` field 22 — a pid reused by another process has another start time) and its results folder. The
runner (:mod:`ampe.trials.lifetime`) reads it back from ``/proc/PID/environ`` to find what a dead runner left; a rank
(:func:`watch_runner`, started by ampe's worker) exits on its own when the runner is gone, even if the guard and
the launcher above it were killed with it. Standard library only; Linux (``/proc``), elsewhere nothing happens.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

MARK = "AMPE_TRIAL_RUNNER"
WATCH_EVERY_S = 2.0  # the rank's watchdog looks this often (one small /proc read: no measurable cost)
EXIT_GRACE_S = 5.0  # SIGTERM to itself, then this long before os._exit


@dataclass(frozen=True)
class RunnerMark:
    """A parsed mark: runner pid, its start ticks, the results folder."""

    pid: int
    start: int
    folder: str

    @classmethod
    def parse(cls, value: str | None) -> RunnerMark | None:
        """The mark in ``value``, or None when there is none or it is malformed."""
        runner, start, folder = [*(value or "").split(":", 2), "", ""][:3]
        if not (runner.isdigit() and start.isdigit()):
            return None
        return cls(int(runner), int(start), folder)

    def text(self) -> str:
        """The environment value."""
        return f"{self.pid}:{self.start}:{self.folder}"

    def runner_alive(self) -> bool:
        """Whether the runner still runs: a live (not zombie) process with its pid and start time."""
        return alive(self.pid) and start_ticks(self.pid) == self.start


def mark_of(folder: str | Path, pid: int | None = None) -> RunnerMark:
    """The mark for processes that runner ``pid`` (default: this process) starts for ``folder``."""
    pid = os.getpid() if pid is None else pid
    return RunnerMark(pid, start_ticks(pid) or 0, os.path.realpath(folder))


def _stat_fields(pid: int) -> list[bytes] | None:
    """``/proc/PID/stat`` after "pid (comm) " (fields 3...), or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2:].split()


def start_ticks(pid: int) -> int | None:
    """Start time of process ``pid`` in clock ticks since boot, or None if it is gone."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (exists and is not a zombie)."""
    fields = _stat_fields(pid)
    return fields is not None and bool(fields) and fields[0] not in (b"Z", b"X")


def watch_runner(who: str, every_s: float = WATCH_EVERY_S) -> threading.Thread | None:
    """In a rank: when this process carries a runner's mark and that runner is gone, say so in one line on stderr
    and end this process (SIGTERM to itself, ``os._exit(143)`` after EXIT_GRACE_S). A daemon thread; None when there
    is no mark (a rank the user launched) or no ``/proc``."""
    mark = RunnerMark.parse(os.environ.get(MARK))
    if mark is None or start_ticks(os.getpid()) is None:  # not a runner's rank, or no /proc to watch it through
        return None

    def watch() -> None:
        while mark.runner_alive():
            time.sleep(every_s)
        sys.stderr.write(f"{who}: the trial runner (pid {mark.pid}) is gone; this rank ends too\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(EXIT_GRACE_S)
        os._exit(128 + signal.SIGTERM)

    thread = threading.Thread(target=watch, name="ampe-runner-watchdog", daemon=True)
    thread.start()
    return thread


__all__ = ["MARK", "RunnerMark", "alive", "mark_of", "start_ticks", "watch_runner"]
