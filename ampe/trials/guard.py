"""Keep a trial's processes from outliving the runner: ``python -m ampe.trials.guard RUNNER_PID ARGV...``.

The runner (:func:`ampe.trials.process.start`) starts every launcher — torchrun, the DeepSpeed runner, or one rank of
the local launcher — through this guard, which

1. asks Linux to send it SIGTERM when the runner dies, even by ``kill -9`` (``prctl(PR_SET_PDEATHSIG)``, called here
   through ctypes: the runner needs no ``preexec_fn``, which is unsafe in a process with threads);
2. makes itself a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): a process orphaned below it — torchrun's ranks,
   which torchrun starts in sessions of their own, when torchrun dies — is re-parented to the guard instead of init,
   so the guard can still find it;
3. checks that the runner is still its parent (it may have died before step 1), then starts ARGV as its child with
   ``PR_SET_PDEATHSIG`` = SIGTERM too (set in the child before exec; the guard has no threads, so that is safe
   here), so the launcher learns of the guard's death as well;
4. waits. When the launcher exits, anything still left below the guard gets SIGTERM, then SIGKILL after
   :data:`GRACE_S`, and the guard exits with the launcher's status — re-raising the signal that killed it, so the
   runner sees -9 for a rank killed by SIGKILL, as without the guard. On SIGTERM, SIGINT or SIGHUP (the runner
   stopping the trial, or the runner's death) it does the same to every process below it, then dies of that signal.

Decision: a guard process rather than ``PR_SET_PDEATHSIG`` on the launcher alone — torchrun's ranks live in their own
sessions and outlive a SIGKILLed torchrun, and the user's worker may be any script; only a subreaper still sees them.
The death signal follows the *thread* that started the guard: the runner starts and waits for a trial on the same
thread. Off Linux (no ``prctl``) the guard only passes the launcher's exit status through.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 5.0  # SIGTERM → SIGKILL delay for what is left below the guard
_STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def _child_setup() -> None:  # runs in the launcher before exec (the guard is single-threaded)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def descendants(root: int) -> list[int]:
    """Pids of every live process below ``root`` (from /proc; empty where there is none)."""
    parent: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
        if fields and fields[0] != b"Z":
            parent[int(name)] = int(fields[1])
    below, frontier = [], [root]
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    while frontier:
        kids = [c for p in frontier for c in children.get(p, [])]
        below += kids
        frontier = kids
    return below


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def end_all_below(grace_s: float = GRACE_S) -> None:
    """SIGTERM every process below this one, SIGKILL after ``grace_s`` what is still there; reap what exits."""
    me = os.getpid()
    _signal(descendants(me), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap()
        if not descendants(me):
            return
        time.sleep(0.05)
    _signal(descendants(me), signal.SIGKILL)
    _reap()


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _die(sig: int) -> None:
    """End this process by ``sig`` (its default action), as the launcher ended."""
    with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    time.sleep(1)  # the signal arrives
    os._exit(128 + sig)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        sys.stderr.write("usage: python -m ampe.trials.guard RUNNER_PID ARGV...\n")
        return 2
    runner = int(argv[0])
    stopped: list[int] = []

    def stop(signum: int, frame: object) -> None:
        stopped.append(signum)

    for sig in _STOPS:
        signal.signal(sig, stop)
    watched = _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    if watched and os.getppid() != runner:  # the runner died before the death signal was armed
        return 128 + signal.SIGTERM
    launcher = subprocess.Popen(argv[1:], preexec_fn=_child_setup if watched else None)
    while True:
        if stopped:
            end_all_below()
            _die(stopped[0])
        code = launcher.poll()
        if code is not None:
            break
        time.sleep(0.05)
    if descendants(os.getpid()):
        end_all_below()
    if code < 0:
        _die(-code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
