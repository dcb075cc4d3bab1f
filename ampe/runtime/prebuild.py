"""Build DeepSpeed's CPU comm op once, before any rank starts, under ampe's kernel lock (docs/trials.md).

    python -m ampe.runtime.prebuild

builds (or only checks) ``deepspeed_shm_comm`` in the folder every rank will use — ``$TORCH_EXTENSIONS_DIR`` when set,
else ampe's keyed folder (:func:`ampe.jitops.extensions_dir`) — and says so in one line when a build is needed. It
holds ampe's build lock (``flock``) throughout, so a second ampe process waits for it, and a killed one releases it.
A torch build lock whose builder is gone is cleared first with one line (in ampe's own folder), or refused with one
line (in the user's ``TORCH_EXTENSIONS_DIR``). DeepSpeed's own output goes to ``<folder>/ampe-build.log``.

Exit status: 0 built, up to date, or nothing to build (DeepSpeed would not build this op here); 1 the build failed;
2 a stale lock in a folder ampe does not own. ``ampe trial``, the launch scripts of ``ampe export``, ``make test`` and
``make demo`` run it; ampe's worker and :meth:`ampe.runtime.user.ExportedPlan.select_device` call :func:`ensure_op`
in every rank, so a rank whose host the prebuild never ran on (another host of a multi-host launch) builds there
under the same lock instead of waiting on a baton.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import ampe.jitops as jitops
from ampe.errors import InputError
from ampe.jitops import ENV, ExtensionsDir, build_lock, extensions_dir, mark_ready, prepare, wait_for_batons

LOG_FILE = "ampe-build.log"
LOG_LIMIT_BYTES = 4 << 20  # the log starts afresh beyond this
BUILDER = "ShareMemCommBuilder"


class BuildError(RuntimeError):
    """DeepSpeed's op did not build or load; the message is one line."""


def _say(text: str) -> None:
    sys.stderr.write(f"ampe: {text}\n")
    sys.stderr.flush()


def ensure_op(ext: ExtensionsDir | None = None, say: Callable[[str], None] = _say) -> Path | None:
    """Make sure DeepSpeed's CPU comm op is built in ``ext`` (default: :func:`~ampe.jitops.extensions_dir`) and
    loaded in this process, under ampe's build lock; DeepSpeed's ``init_distributed`` then finds it loaded and takes
    no baton. Sets ``TORCH_EXTENSIONS_DIR`` of this process to the folder and puts the ninja its key names first on
    ``PATH`` (:func:`~ampe.jitops.build_path`). A build that happens is said in one line with its duration.
    Returns the library, or None when DeepSpeed would not build this op here (another accelerator, an incompatible
    platform, or the op came precompiled with DeepSpeed). Raises :class:`~ampe.errors.InputError` for a stale lock
    in the user's folder and :class:`BuildError` when the build fails (in ampe's own folder the op's build folder is
    then removed, so the next start builds from scratch)."""
    ext = ext if ext is not None else extensions_dir()
    os.environ[ENV] = str(ext.path)  # torch reads it when it builds; ranks started from here inherit it
    os.environ["PATH"] = jitops.build_path(os.environ)  # the ninja the folder's key names, from any shell
    prepare(ext)
    with build_lock(ext, on_wait=say):
        wait_for_batons(ext, say)
        try:
            import deepspeed.ops
        except ImportError as e:
            raise BuildError(f"DeepSpeed is not importable ({e}); install ampe's trial extra: pip install -e "
                             "'.[trial]'") from e
        from deepspeed.accelerator import get_accelerator
        from deepspeed.git_version_info import accelerator_name, installed_ops

        builder = get_accelerator().create_op_builder(BUILDER)
        if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
            return None  # DeepSpeed's build_shm_op() would not build it either
        if installed_ops.get(builder.NAME, False) and accelerator_name == get_accelerator()._name:
            return None  # shipped precompiled: DeepSpeed imports it, nothing is JIT-built
        before = _mtime(ext.library)
        if before is None:
            say(f"building DeepSpeed's CPU comm op once (about a minute) in {ext.path}")
        started = time.monotonic()
        try:
            builder.load(verbose=False)
        except Exception as e:
            raise BuildError(_failed(ext, e)) from e
        took = time.monotonic() - started
        after = _mtime(ext.library)
        if before is None:
            say(f"built DeepSpeed's CPU comm op in {took:.0f} s")
        elif after != before:
            say(f"rebuilt DeepSpeed's CPU comm op in {took:.0f} s in {ext.path} (a build had been cut off, or its "
                "sources, flags or build tools changed)")
        mark_ready(ext)
        return ext.library


def _failed(ext: ExtensionsDir, e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    why = (errors or lines or [type(e).__name__])[0]
    msg = f"DeepSpeed's CPU comm op did not build in {ext.op_dir}: {why}"
    if ext.owned:
        shutil.rmtree(ext.op_dir, ignore_errors=True)
        msg += " (its build folder was removed, so the next start builds it from scratch)"
    return msg


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _quiet_output(ext: ExtensionsDir) -> Callable[[str], None]:
    """Send this process's stdout and stderr (DeepSpeed's and the compiler's output) to ``<folder>/ampe-build.log``;
    return a ``say`` that still writes one line to the original stderr."""
    original = os.fdopen(os.dup(2), "w", buffering=1)
    log = ext.path / LOG_FILE
    try:
        mode = "wb" if log.stat().st_size > LOG_LIMIT_BYTES else "ab"
    except OSError:
        mode = "ab"
    with open(log, mode) as f:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)

    def say(text: str) -> None:
        original.write(f"ampe: {text}\n")
        original.flush()
        sys.stderr.write(f"ampe: {text}\n")  # into the log too, between DeepSpeed's lines
        sys.stderr.flush()

    return say


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring)."""
    argparse.ArgumentParser(prog="python -m ampe.runtime.prebuild",
                            description="Build DeepSpeed's CPU comm op once, under ampe's build lock, in the folder "
                            "every rank uses (docs/trials.md).").parse_args(argv)
    os.environ["DS_ACCELERATOR"] = "cpu"  # the op of DeepSpeed's CPU accelerator, whatever this shell had
    ext = extensions_dir()
    say: Callable[[str], None] = _say
    try:
        prepare(ext)
        say = _quiet_output(ext)
        ensure_op(ext, say)
    except InputError as e:
        say(f"error: {e}")
        return 2
    except BuildError as e:
        say(f"error: {e} (DeepSpeed's output: {ext.path / LOG_FILE})")
        return 1
    except OSError as e:
        say(f"error: {ext.path}: {e.strerror or e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
