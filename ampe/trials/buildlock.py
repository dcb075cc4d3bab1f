"""Find stale JIT build locks that make every DeepSpeed start wait forever.

DeepSpeed builds its CPU communication op on first start through torch's ``cpp_extension``, which guards the build
with a ``lock`` file in the extension's build folder (a ``FileBaton``: no owner pid, no expiry). A process killed in
the middle of that build leaves the file behind, and every later start on the machine then waits on it without end:
a trial shows up only as ``timeout``. The runner cannot tell a live build from a dead one, so it names old locks and
leaves deleting them to the user.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

# A build of DeepSpeed's CPU ops takes about a minute on 2 busy cores; a lock this old is almost surely dead.
STALE_AFTER_S = 600.0


def extensions_root() -> Path:
    """Where torch keeps JIT-built extensions: ``$TORCH_EXTENSIONS_DIR`` if set (even empty: torch then builds
    relative to the working folder), else ``$XDG_CACHE_HOME/torch_extensions`` or ``~/.cache/torch_extensions``.
    Raises RuntimeError when no home folder can be found (as :meth:`pathlib.Path.home`)."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is not None:
        return Path(root)
    cache = os.environ.get("XDG_CACHE_HOME")
    return Path(cache if cache is not None else Path.home() / ".cache") / "torch_extensions"


def stale_locks(root: Path | None = None, older_than_s: float = STALE_AFTER_S,
                now: float | None = None) -> list[Path]:
    """Build locks under ``root`` (default: :func:`extensions_root`) last modified more than ``older_than_s``
    seconds ago. Looks at ``root/*/lock`` (``$TORCH_EXTENSIONS_DIR`` layout) and ``root/*/*/lock`` (torch's
    per-Python folders); never raises (no home folder, unreadable folders: no locks)."""
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
            "op (DeepSpeed's CPU ops among them) waits on it forever; delete it if no build (ninja, cc1plus) is "
            "running")
