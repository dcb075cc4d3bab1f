"""Which trial processes belong to which runner, one runner per results folder, and no measurement beside the
leftovers of an earlier run.

Every process the runner starts on its own host (the guard, torchrun or DeepSpeed's runner, every local rank and all
they start) inherits the runner's mark in its environment (:mod:`ampe.runnermark`: runner pid, its start time, the
results folder). A process's initial environment stays readable in ``/proc/PID/environ`` (same user), so the runner
can tell, with no pid file to go stale, every process an earlier run left behind; and ampe's worker watches the
runner from every rank and ends the rank when the runner is gone (:func:`ampe.runnermark.watch_runner`).

Before the first trial, :func:`claim` (called by :func:`ampe.trials.runner.run_trials`):

1. takes an exclusive ``flock`` on ``FOLDER/.ampe-trial.lock`` (released by the kernel when the runner dies, even by
   ``kill -9``): a second ``ampe trial`` on the same folder while the first runs is refused, one line naming its
   pid, exit 2 — two runners would measure each other;
2. finds the *leftovers*: live processes marked by a runner that is gone (no process with that pid and start time).
   The guard (:mod:`ampe.trials.guard`) normally takes every process with the runner, but not when the guard died
   with it (``kill -9`` of the whole process group, the OOM killer, a runner of an older ampe), and a rank of
   torchrun then keeps running — the issue measured +58 % on a resumed trial beside two such ranks, recorded ``ok``.
   Decision: leftovers are ampe's own trial processes whose runner is dead and whose results nobody will read (a
   resumed trial reruns in a fresh job folder), so they are ended — SIGTERM, SIGKILL after a grace — and the runner
   says so in one line on stderr before anything is measured. One that cannot be ended (another user's, a process
   stuck in the kernel) makes the run refuse to start, one line, exit 2: a measurement beside it would not be clean.
   Leftovers of *any* folder are ended, not only this one's: they slow every measurement on the host alike.
3. names, in one warning line, trial processes of other *live* runners (another folder's ``ampe trial`` at the same
   time): not ended — they are someone's measurement — but they share the host, and ``host_other_cores`` in every
   record says by how much.

Limits: processes the DeepSpeed runner starts on other hosts over ssh do not inherit the mark (only
``.deepspeed_env`` crosses), so only this host is checked; Linux only (``/proc``), elsewhere nothing is found.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ampe.errors import InputError, os_reason
from ampe.outfolder import OutputFolder
from ampe.runnermark import MARK, RunnerMark, alive, mark_of

LOCK_FILE = ".ampe-trial.lock"
END_GRACE_S = 5.0  # SIGTERM → SIGKILL for leftovers
GONE_WAIT_S = 30.0  # then how long they may take to disappear (a process in uninterruptible sleep) before refusing


@dataclass(frozen=True)
class Marked:
    """A live process carrying :data:`MARK`: its pid, command line, and whose it is (runner pid and start ticks,
    results folder)."""

    pid: int
    cmdline: str
    runner: RunnerMark


def marked_processes() -> list[Marked]:
    """Every live process of this user carrying :data:`MARK` (this process excluded); empty off Linux."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    me, uid = os.getpid(), os.getuid()
    key = f"{MARK}=".encode()
    found = []
    for name in entries:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
            if key not in env:
                continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile, or not readable
            continue
        value = next((v[len(key):] for v in env.split(b"\0") if v.startswith(key)), b"").decode(errors="replace")
        runner = RunnerMark.parse(value)
        if runner is not None and alive(int(name)):
            found.append(Marked(int(name), cmdline, runner))
    return found


def orphaned(p: Marked) -> bool:
    """Whether the runner that started ``p`` is gone (no live process with its pid and start time)."""
    return not p.runner.runner_alive()


@dataclass
class RunClaim:
    """This runner's hold on a results folder (the lock's descriptor) and the mark its processes carry."""

    fd: int
    mark: str

    def release(self) -> None:
        """Give the folder up (the kernel does it too when the runner dies)."""
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


def claim(folder: OutputFolder, say: bool = True) -> RunClaim:
    """Lock the results folder for this runner and end the leftovers of dead runners (module docstring). Raises
    InputError when another live runner holds the folder, or a leftover cannot be ended."""
    fd = folder.open_append(LOCK_FILE, read=True)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = os.pread(fd, 32, 0).decode(errors="replace").split()[:1]
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            who = f" (pid {holder[0]})" if holder and holder[0].isdigit() else ""
            raise InputError("--out", "", f"{folder.path}: another `ampe trial`{who} is running trials in this folder; "
                             "two runners would measure each other (wait for it, or use another --out)") from None
        raise InputError("--out", "", f"{folder.path}: cannot lock the folder ({os_reason(e)})") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    result = RunClaim(fd, mark_of(folder.path).text())
    try:
        _end_leftovers(folder.path, say)
    except BaseException:
        result.release()
        raise
    return result


def _end_leftovers(here: Path, say: bool) -> None:
    marked = marked_processes()
    left = [p for p in marked if orphaned(p)]
    live_runners = sorted({(p.runner.pid, p.runner.folder) for p in marked if not orphaned(p)})
    if left:
        _end([p.pid for p in left])
        still = [p for p in left if alive(p.pid)]
        if still:
            raise InputError("--out", "", f"{len(still)} process(es) of an earlier `ampe trial` whose runner is gone "
                             f"are still running and could not be ended (pids {_pids(still)}); a measurement beside "
                             "them would not be clean: end them first")
        if say:
            mine = sum(p.runner.folder == str(here) for p in left)
            where = "this folder's" if mine == len(left) else f"{mine} of this folder's, {len(left) - mine} of others'"
            _say(f"{len(left)} process(es) left running by an earlier `ampe trial` whose runner is gone ({where}: "
                 f"pids {_pids(left)}) were ended before measuring (docs/trials.md#leftover-processes)")
    others = [(pid, f) for pid, f in live_runners if f != str(here)]
    if others and say:
        _say(f"warning: another `ampe trial` is running trials on this host (pid {others[0][0]}, {others[0][1]}); its "
             "processes share the CPUs with these trials (`host_other_cores` in each record says how much)")


def _end(pids: list[int]) -> None:
    """SIGTERM ``pids``, SIGKILL after END_GRACE_S what is left, then wait up to GONE_WAIT_S for them to go."""
    for sig, wait_s in ((signal.SIGTERM, END_GRACE_S), (signal.SIGKILL, GONE_WAIT_S)):
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.05)
        if not any(alive(p) for p in pids):
            return


def _pids(procs: list[Marked]) -> str:
    shown = ", ".join(str(p.pid) for p in procs[:8])
    return shown + (f" and {len(procs) - 8} more" if len(procs) > 8 else "")


def _say(text: str) -> None:
    sys.stderr.write(f"ampe trial: {text}\n")
    sys.stderr.flush()


__all__ = ["LOCK_FILE", "Marked", "RunClaim", "claim", "marked_processes", "orphaned"]
