"""DeepSpeed's JIT-built CPU op, seen from the trial runner (which imports neither torch nor DeepSpeed).

CPU trials: before any rank starts, :func:`prebuild` runs ``python -m ampe.runtime.prebuild`` with the ranks'
environment (it builds ``deepspeed_shm_comm`` once, in the folder the ranks get as ``TORCH_EXTENSIONS_DIR``, under
ampe's kernel lock, and says so in one line), unless ampe's own folder already holds a finished build
(:func:`ampe.jitops.is_ready`). Before each trial, and after one timed out, :func:`sweep` clears a torch build lock
whose builder is gone (:mod:`ampe.jitops`), so a rank killed while it held one cannot make the next trial wait.

GPU trials build nothing here and keep torch's default folder; for them :func:`stale_locks` and :func:`lock_advice`
still name build locks older than 10 minutes (a build takes about a minute), leaving the deleting to the user.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import ampe.jitops as jitops
from ampe.errors import InputError

STALE_AFTER_S = 600.0  # GPU trials: a build of DeepSpeed's ops takes about a minute; a lock this old is surely dead
PREBUILD = ("-m", "ampe.runtime.prebuild")


def prebuild_argv() -> list[str]:
    """The command that builds DeepSpeed's CPU op before the ranks start (run it with the ranks' environment)."""
    return [sys.executable, *PREBUILD]


def prebuild(env: Mapping[str, str], say: Callable[[str], None], stop: Callable[[], bool] | None = None,
             grace_s: float = 5.0, quiet_s: float | None = None) -> bool:
    """Build DeepSpeed's CPU op for ranks started with ``env`` (the full environment), relaying the builder's
    lines to ``say`` as they come. Returns False when ``stop()`` asked to stop meanwhile (the builder, in its own
    process group, gets SIGINT, then SIGKILL after ``grace_s``), True when the op is ready. Raises InputError with
    the builder's last line when it fails. ``quiet_s``: how long (s) a build lock no process holds must stay so
    before it counts as dead (None: :data:`ampe.jitops.QUIET_S`)."""
    ext = jitops.extensions_dir(env)
    jitops.sweep_unlocked(ext, say, quiet_s)  # a stale lock in the user's folder is refused here, in one line
    if jitops.is_ready(ext):
        return True
    proc = subprocess.Popen(prebuild_argv(), env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    error: str | None = None  # the builder's error line: raised, not said
    done = False
    try:
        while not done:
            if stop is not None and stop():
                _stop(proc, grace_s)
                return False
            try:
                line = lines.get(timeout=0.1)
            except queue.Empty:
                continue
            if line is None:
                done = True
            elif line.startswith("ampe: error: "):
                error = line.removeprefix("ampe: error: ")
            elif line:
                say(line.removeprefix("ampe: "))  # as it comes: "building ... once" before any rank starts
    finally:
        if proc.poll() is None and not done:
            _stop(proc, grace_s)
    code = proc.wait()
    if code == 0:
        return True
    why = error or f"{' '.join(prebuild_argv())} exited with status {code}"
    raise InputError(str(ext.path), "", f"no DeepSpeed rank can start: {why}")


def _stop(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGINT the builder's process group (torch then releases its lock, ninja removes partial outputs), SIGKILL it
    after ``grace_s``."""
    for sig in (signal.SIGINT, signal.SIGKILL):
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, sig)
        deadline = time.monotonic() + grace_s
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is not None:
            return
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def sweep(env: Mapping[str, str], say: Callable[[str], None], quiet_s: float | None = None) -> list[Path]:
    """Clear torch build locks whose builder is gone from the folder the ranks use (see :mod:`ampe.jitops`): the
    locks cleared (each said in one line). Takes nothing when an ampe build runs; raises InputError for a stale lock
    in the user's own ``TORCH_EXTENSIONS_DIR``."""
    return list(jitops.sweep_unlocked(jitops.extensions_dir(env), say, quiet_s).cleared)


def extensions_root() -> Path:
    """Where torch keeps JIT-built extensions by default: ``$TORCH_EXTENSIONS_DIR`` if set (even empty: torch then
    builds relative to the working folder), else ``$XDG_CACHE_HOME/torch_extensions`` or
    ``~/.cache/torch_extensions``. Raises RuntimeError when no home folder can be found (as :meth:`Path.home`)."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is not None:
        return Path(root)
    cache = os.environ.get("XDG_CACHE_HOME")
    return Path(cache if cache is not None else Path.home() / ".cache") / "torch_extensions"


def stale_locks(root: Path | None = None, older_than_s: float = STALE_AFTER_S,
                now: float | None = None) -> list[Path]:
    """GPU trials: build locks under ``root`` (default: :func:`extensions_root`) last modified more than
    ``older_than_s`` seconds ago, in both torch layouts (``root/*/lock``, ``root/*/*/lock``); never raises."""
    now = time.time() if now is None else now
    found: list[Path] = []
    try:
        base = root if root is not None else extensions_root()
        candidates = [*base.glob("*/lock"), *base.glob("*/*/lock")]
    except (OSError, RuntimeError):
        return []
    for lock in sorted(candidates):
        try:
            if now - lock.stat().st_mtime > older_than_s:
                found.append(lock)
        except OSError:
            continue
    return found


def lock_advice(locks: list[Path]) -> str:
    """One sentence naming the locks and what to do about them ("" when there are none)."""
    if not locks:
        return ""
    names = ", ".join(str(p) for p in locks[:3]) + (f" and {len(locks) - 3} more" if len(locks) > 3 else "")
    return (f"stale JIT build lock {names}: a build killed midway leaves it, and every later start that builds that "
            "op waits on it forever; delete it if no build (ninja, cc1plus) is running")
