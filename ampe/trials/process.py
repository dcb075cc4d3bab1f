"""Start a trial's processes in their own session, watch them, and kill every one of them when needed.

All processes of a trial start in a new session or process group (so the terminal's Ctrl-C reaches only the runner,
which then stops the trial itself). torchrun starts each rank in yet another session, so killing the launcher's
process group is not enough: :meth:`TrialProcesses.kill` first collects every descendant (psutil), sends SIGTERM to
all their process groups, waits ``grace_s``, then SIGKILLs whatever is left — including ranks that the launcher's
death orphaned.

Every launcher (and every rank of the local launcher) runs below a guard, ``python -m ampe.trials.guard``
(:mod:`ampe.trials.guard`): when the runner itself dies — even by ``kill -9``, when none of the above can run — the
guard is told by the kernel and ends the launcher and every rank below it, so no trial outlives its runner.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from ampe.blas import launch_environ
from ampe.runnermark import MARK
from ampe.trials.commands import Launch


@dataclass
class TrialProcesses:
    """The running processes of one trial (one launcher, or one process per rank for the local launcher)."""

    launch: Launch
    procs: list[subprocess.Popen]
    log: IO[bytes]
    fail_grace_s: float = 3.0
    _first_failure: float | None = field(default=None, repr=False)
    killed_by_runner: bool = field(default=False, repr=False)
    codes_at_kill: list[int | None] | None = field(default=None, repr=False)

    def poll(self) -> bool:
        """True once the trial is over. For the local launcher, when one rank fails the others get
        ``fail_grace_s`` to report, then are killed (torchrun does the same for its ranks)."""
        codes = [p.poll() for p in self.procs]
        if all(c is not None for c in codes):
            return True
        if any(c not in (None, 0) for c in codes):
            now = time.monotonic()
            if self._first_failure is None:
                self._first_failure = now
            elif now - self._first_failure >= self.fail_grace_s:
                self.kill(grace_s=1.0)
                return True
        return False

    def returncodes(self) -> list[int | None]:
        """Exit status per process (negative: killed by that signal) as the trial itself ended them: when the
        runner killed the trial, the statuses from just before (None for what it had to kill), so the runner's own
        signals are never blamed on a rank."""
        if self.codes_at_kill is not None:
            return list(self.codes_at_kill)
        return [p.poll() for p in self.procs]

    def kill(self, grace_s: float = 5.0) -> None:
        """SIGTERM every process of the trial (all descendants, all their process groups), SIGKILL after
        ``grace_s`` what is still alive, and reap the launcher processes."""
        if self.codes_at_kill is None:
            self.codes_at_kill = [p.poll() for p in self.procs]
        self.killed_by_runner = True
        victims = _descendants(self.procs)
        groups = {_pgid(p.pid) for p in self.procs} | {_pgid(v.pid) for v in victims}
        groups.discard(None)
        groups.discard(os.getpgrp())
        _signal_all(groups, victims, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if all(p.poll() is not None for p in self.procs) and not any(_alive(v) for v in victims):
                break
            time.sleep(0.05)
        victims += [v for v in _descendants(self.procs) if v not in victims]
        _signal_all(groups, victims, signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):  # SIGKILL cannot be ignored
                p.wait(timeout=5)

    def close(self) -> None:
        """Close the log file (after the processes are gone)."""
        self.log.close()


def start(launch: Launch, log_path: Path, cwd: str | None = None, mark: str | None = None) -> TrialProcesses:
    """Start the launcher (or every rank) in a new session, stdout and stderr appended to ``log_path``. ``mark``:
    the runner's mark (:mod:`ampe.runnermark`), inherited by every process of the trial on this host (so a later
    runner can tell them if they outlive this one)."""
    # never through a link, never blocking on a FIFO planted in its place (O_NOFOLLOW, O_NONBLOCK; a fresh job folder)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    os.set_blocking(fd, True)
    log = open(fd, "ab", buffering=0)  # noqa: SIM115 - TrialProcesses owns it and closes it in close()
    base = {**launch_environ(), **launch.env}  # the user's environment: no BLAS limit of ampe's own (ampe.blas)
    if mark is not None:
        base[MARK] = mark
    argv = guarded(launch.argv)
    procs: list[subprocess.Popen] = []
    try:
        if launch.kind == "local":
            for r, renv in enumerate(launch.rank_env):
                # one new process group for all ranks (setpgid cannot cross sessions, so no new session here; a
                # background group gets no terminal signals either)
                procs.append(subprocess.Popen(argv, env={**base, **renv}, stdout=log,
                                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd,
                                              process_group=0 if r == 0 else procs[0].pid))
        else:
            procs.append(subprocess.Popen(argv, env=base, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, cwd=cwd, start_new_session=True))
    except BaseException:
        TrialProcesses(launch, procs, log).kill(grace_s=0.5)
        log.close()
        raise
    return TrialProcesses(launch, procs, log)


def guarded(argv: tuple[str, ...] | list[str]) -> list[str]:
    """``argv`` run below :mod:`ampe.trials.guard`, which ends it and everything it started if this process dies.
    The guard is found by file path (``-I``: no site packages, user paths or PYTHON* variables), so it needs
    nothing of the environment the launcher gets."""
    return [sys.executable, "-I", str(Path(__file__).with_name("guard.py")), str(os.getpid()), *argv]


def _descendants(procs: list[subprocess.Popen]) -> list:
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil comes with deepspeed (the `trial` extra)
        return []
    out = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            out += psutil.Process(p.pid).children(recursive=True)
    return out


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _alive(proc) -> bool:
    try:
        return proc.is_running() and proc.status() != "zombie"
    except Exception:
        return False


def _signal_all(groups: set, victims: list, sig: int) -> None:
    for g in groups:
        with contextlib.suppress(OSError):
            os.killpg(g, sig)
    for v in victims:
        try:
            if v.is_running():  # psutil checks the creation time, so a reused pid is never hit
                v.send_signal(sig)
        except Exception:
            pass
