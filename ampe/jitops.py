"""Where DeepSpeed's JIT-built CPU op lives, and how ampe knows that a build lock's builder is gone.

DeepSpeed builds its CPU communication op (``deepspeed_shm_comm``) on the first start of a rank, through torch's
``cpp_extension``, in ``$TORCH_EXTENSIONS_DIR/deepspeed_shm_comm/``. torch guards that folder with a *baton*: the file
``lock``, created with ``O_EXCL`` and removed when the build (or, in every later start, the up-to-date check) is
done. It names no owner and has no expiry, so a process killed while it holds the baton leaves it behind and every
later start waits on it forever.

ampe therefore

* builds in a folder of its own, keyed by what the build depends on (:func:`extensions_dir`:
  ``<cache>/ampe-torch-extensions/<torch>-<DeepSpeed>-<Python>-<hash>``), so two environments never rebuild each
  other's op;
* builds only under its own kernel lock (:func:`build_lock`: ``fcntl.flock`` on ``ampe-build.lock`` in that folder),
  which the kernel releases when its holder dies, so no ampe process ever waits on a dead ampe builder;
* takes a baton for dead (:func:`clear_stale`) when, with that lock held, **no process on this machine has the baton
  open or works in its build folder** (torch keeps the baton's descriptor open from creating it to removing it, and
  ninja and the compilers run in the build folder) and that stays so for ``QUIET_S`` seconds (a start on another
  host sharing the folder holds it for well under a second). In ampe's own folder such a baton is deleted, with one
  line saying so; in a folder the user chose (``TORCH_EXTENSIONS_DIR``) ampe deletes nothing and stops with one line
  naming it, because processes on other hosts or in other containers sharing that folder cannot be seen from here.

Nothing here imports torch or DeepSpeed: versions and locations come from the installed packages' metadata, so the
trial runner (which must not import them) computes the same folder the ranks use. Linux only (``/proc``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ampe.errors import InputError
from ampe.io import write_json_atomic

OP = "deepspeed_shm_comm"  # the op DeepSpeed's CPU accelerator JIT-builds at a rank's first start
ROOT_NAME = "ampe-torch-extensions"  # ampe's own folders: <cache>/ampe-torch-extensions/<key>
ENV = "TORCH_EXTENSIONS_DIR"  # torch builds (and looks for) extensions in $TORCH_EXTENSIONS_DIR/<op>/
LOCK_FILE = "ampe-build.lock"  # ampe's kernel lock (flock), in the extensions folder; never deleted
KEY_FILE = "ampe-key.json"  # what an ampe folder is keyed by (for people reading the folder)
READY_FILE = "ampe-ready.json"  # in <folder>/<op>/: ampe built and loaded the op there, and no build was cut off
BATON = "lock"  # torch's FileBaton in <folder>/<op>/
QUIET_S = 5.0  # seconds a baton no process on this machine holds must stay so before it counts as dead
POLL_S = 0.2
SAY_WAIT_AFTER_S = 3.0  # a rank checking a built op holds the build lock well under this: no line for that

Say = Callable[[str], None]


@dataclass(frozen=True)
class ExtensionsDir:
    """The folder torch builds DeepSpeed's ops in (``TORCH_EXTENSIONS_DIR`` of every rank).

    ``owned``: ampe made it for itself (it lies in a folder named ``ampe-torch-extensions``), so only ampe's
    processes build there and a dead builder's baton may be deleted; otherwise it is the user's folder."""

    path: Path
    owned: bool

    @property
    def op_dir(self) -> Path:
        """The op's build folder (``<path>/deepspeed_shm_comm``)."""
        return self.path / OP

    @property
    def library(self) -> Path:
        """The built op (``<path>/deepspeed_shm_comm/deepspeed_shm_comm.so``)."""
        return self.op_dir / f"{OP}.so"


@dataclass(frozen=True)
class Baton:
    """A torch build lock that is there now, and the processes on this machine that hold it (pids)."""

    path: Path
    holders: tuple[int, ...]


@dataclass(frozen=True)
class Sweep:
    """What :func:`clear_stale` found: batons it deleted, and batons live processes hold."""

    cleared: tuple[Path, ...]
    live: tuple[Baton, ...]


# --- the keyed folder --------------------------------------------------------------------------------------------


@lru_cache(maxsize=8)
def _package(name: str) -> tuple[str, str]:
    """(version, install folder) of an installed package, from its metadata: nothing is imported."""
    try:
        version = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        version = "none"
    try:
        spec = importlib.util.find_spec(name)  # a top-level name: found, not imported
    except (ImportError, ValueError):
        spec = None
    origin = spec.origin if spec is not None and spec.origin else ""
    # absolute, links kept: torch and DeepSpeed name their headers and sources by this path in build.ninja, so two
    # environments reaching one install through different links (a linked venv) would rebuild each other's op
    return version, os.path.dirname(os.path.abspath(origin)) if origin else ""


def build_path(environ: Mapping[str, str]) -> str:
    """The ``PATH`` every build of the op runs with: this environment's scripts folder (a venv's ``bin``) first when
    it holds ``ninja``, else ``environ``'s ``PATH`` as it is. torch runs the first ``ninja`` on ``PATH``, and two
    ninja versions hash the build commands differently (1.11 and 1.13 each see the other's build as stale), so the
    Makefile (system ``PATH``) and an activated shell (the venv's ``bin`` first) must find the same one."""
    path = environ.get("PATH", os.defpath)
    scripts = sysconfig.get_path("scripts")
    if not scripts or not os.access(os.path.join(scripts, "ninja"), os.X_OK):
        return path
    rest = [p for p in path.split(os.pathsep) if p and os.path.abspath(p) != os.path.abspath(scripts)]
    return os.pathsep.join([scripts, *rest])


@lru_cache(maxsize=8)
def _tool_version(name: str, path: str) -> str:
    """The first line of ``<name> --version`` for the ``name`` found on ``path`` ("none" when there is none)."""
    found = shutil.which(name, path=path)
    if found is None:
        return "none"
    try:
        out = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (out.strip().splitlines() or ["unknown"])[0]


def key_fields(environ: Mapping[str, str]) -> dict[str, str]:
    """What the op's build depends on: torch's and DeepSpeed's versions and install folders (their headers and
    sources are named by absolute path in torch's ``build.ninja``, so a second environment with the same versions
    would still rebuild), the Python version, ABI and headers, the machine, the compiler (``$CXX``, and its
    version) and ninja's version (the one on :func:`build_path`: it decides what counts as stale). DeepSpeed
    compiles this op with fixed flags (``-O2 -fopenmp``), so its version stands for them."""
    torch_version, torch_at = _package("torch")
    ds_version, ds_at = _package("deepspeed")
    path = build_path(environ)
    cxx = environ.get("CXX", "c++")
    return {"torch": torch_version, "torch_at": torch_at, "deepspeed": ds_version, "deepspeed_at": ds_at,
            "python": f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}",
            "python_include": sysconfig.get_paths().get("include", ""), "machine": platform.machine(),
            "cxx": cxx, "cxx_version": _tool_version(cxx, path), "ninja": _tool_version("ninja", path),
            "op": OP, "scheme": "2"}


def folder_name(fields: Mapping[str, str]) -> str:
    """``torch<version>-ds<version>-<python>-<12 hex digits of SHA-256 of every field>``, filesystem-safe."""
    digest = hashlib.sha256(json.dumps(dict(fields), sort_keys=True).encode()).hexdigest()[:12]
    name = f"torch{fields['torch']}-ds{fields['deepspeed']}-{fields['python']}-{digest}"
    return re.sub(r"[^A-Za-z0-9._+-]", "_", name)


def deepspeed_installed() -> bool:
    """Whether DeepSpeed is installed (its metadata; nothing imported)."""
    return _package("deepspeed")[0] != "none"


def cache_root(environ: Mapping[str, str]) -> Path:
    """``$XDG_CACHE_HOME/ampe-torch-extensions``, else ``~/.cache/ampe-torch-extensions``; with no home folder
    (a container user missing from ``/etc/passwd``) ``<tmp>/ampe-torch-extensions-<uid>``."""
    cache = environ.get("XDG_CACHE_HOME")
    if cache:
        return Path(cache) / ROOT_NAME
    home = environ.get("HOME")
    if not home:
        try:
            home = str(Path.home())
        except RuntimeError:
            return Path(tempfile.gettempdir()) / f"{ROOT_NAME}-{os.getuid()}"
    return Path(home) / ".cache" / ROOT_NAME


def extensions_dir(environ: Mapping[str, str] | None = None) -> ExtensionsDir:
    """The folder the ranks build and find DeepSpeed's op in. A non-empty ``TORCH_EXTENSIONS_DIR`` is the user's
    choice and is kept as is (torch would use it anyway); it counts as ampe's own only when it is an ampe folder
    (the value ampe itself gave the ranks). Otherwise ampe's keyed folder under :func:`cache_root`. An empty
    ``TORCH_EXTENSIONS_DIR`` (torch would build in the working folder of each rank) counts as unset."""
    environ = os.environ if environ is None else environ
    chosen = environ.get(ENV)
    if chosen:
        path = Path(chosen).absolute()
        return ExtensionsDir(path, path.parent.name == ROOT_NAME)
    fields = key_fields(environ)
    return ExtensionsDir(cache_root(environ) / folder_name(fields), True)


def prepare(ext: ExtensionsDir, environ: Mapping[str, str] | None = None) -> None:
    """Create the folder; an ampe folder also gets ``ampe-key.json`` (what it is keyed by) the first time."""
    ext.path.mkdir(parents=True, exist_ok=True)
    key = ext.path / KEY_FILE
    if ext.owned and not key.exists():
        write_json_atomic(key, {"what": f"DeepSpeed's JIT-built {OP}, built by ampe (docs/trials.md)",
                                **key_fields(os.environ if environ is None else environ)})


def is_ready(ext: ExtensionsDir) -> bool:
    """True when ampe built and loaded the op in its own folder and nothing was cut off since: the library and
    ampe's ready mark are there and no baton is. Then ranks only check it (under a second) and nothing is built."""
    return ext.owned and ext.library.is_file() and (ext.op_dir / READY_FILE).is_file() and not batons(ext)


def mark_ready(ext: ExtensionsDir) -> None:
    """Record that the op in ``ext`` is built and loads (only in ampe's own folder)."""
    if ext.owned and ext.library.is_file():
        write_json_atomic(ext.op_dir / READY_FILE, {"op": OP, "library": str(ext.library),
                                                    "library_mtime": ext.library.stat().st_mtime})


# --- ampe's kernel lock ------------------------------------------------------------------------------------------


def _try_flock(fd: int) -> bool:
    """Take the lock on ``fd`` if nobody holds it (False when another process does)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        return False
    return True


@contextlib.contextmanager
def build_lock(ext: ExtensionsDir, wait: bool = True, on_wait: Say | None = None,
               say_after_s: float = SAY_WAIT_AFTER_S) -> Iterator[bool]:
    """Hold ampe's build lock of ``ext`` (``flock(LOCK_EX)`` on ``<folder>/ampe-build.lock``) for the ``with``
    block; the kernel releases it when the holder exits or dies, however it dies. With ``wait=False`` it yields
    False at once when another process holds it; else it waits, calling ``on_wait`` once (with the holder's pid
    when ``/proc/locks`` shows it) when the lock is still held after ``say_after_s`` seconds (another rank's check
    of a built op takes well under that, a build about a minute)."""
    ext.path.mkdir(parents=True, exist_ok=True)
    fd = os.open(ext.path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        if not _try_flock(fd):
            if not wait:
                yield False
                return
            deadline = time.monotonic() + say_after_s
            while time.monotonic() < deadline:
                if _try_flock(fd):
                    yield True
                    return
                time.sleep(POLL_S / 4)
            if on_wait is not None:
                holder = flock_holder(os.fstat(fd))
                on_wait(f"waiting for another ampe process building DeepSpeed's CPU comm op in {ext.path}"
                        + (f" (pid {holder})" if holder else ""))
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield True
    finally:
        os.close(fd)  # releases the lock


def flock_holder(st: os.stat_result) -> int | None:
    """The pid holding a ``flock`` on the file with this stat, from ``/proc/locks`` (None when not shown)."""
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        text = Path("/proc/locks").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF" (a blocked waiter's line has "->" after the number)
        if "->" in parts or len(parts) < 6 or parts[1] != "FLOCK":
            continue
        if parts[5] == want and parts[4].isdigit():
            return int(parts[4])
    return None


# --- batons and their holders ------------------------------------------------------------------------------------


def batons(ext: ExtensionsDir) -> list[Path]:
    """torch's build locks in ``ext``: every op's in ampe's own folder, only DeepSpeed's CPU op's in the user's."""
    try:
        if ext.owned:
            return sorted(p for p in ext.path.glob(f"*/{BATON}") if not p.is_dir())
        return [ext.op_dir / BATON] if (ext.op_dir / BATON).exists() else []
    except OSError:
        return []


def holders(baton: Path, st: os.stat_result | None = None) -> tuple[int, ...] | None:
    """Pids of processes on this machine that have ``baton`` open (torch's builder keeps it open from creating it
    to removing it) or whose working folder is the baton's folder (ninja and the compilers it starts). None when
    ``/proc`` cannot be read at all. Processes of other users are visible only to root; the baton's creator runs as
    its owner."""
    try:
        st = st if st is not None else os.stat(baton)
        folder = os.stat(baton.parent)
        pids = os.listdir("/proc")
    except OSError:
        return None
    found: list[int] = []
    me = os.getpid()
    for name in pids:
        if not name.isdigit() or int(name) == me:
            continue
        base = f"/proc/{name}"
        try:
            cwd = os.stat(f"{base}/cwd")
            if (cwd.st_dev, cwd.st_ino) == (folder.st_dev, folder.st_ino):
                found.append(int(name))
                continue
        except OSError:
            pass
        try:
            fds = os.listdir(f"{base}/fd")
        except OSError:  # gone, or another user's process
            continue
        for fd in fds:
            try:
                if not os.readlink(f"{base}/fd/{fd}").endswith(f"/{BATON}"):
                    continue
                target = os.stat(f"{base}/fd/{fd}")
            except OSError:
                continue
            if (target.st_dev, target.st_ino) == (st.st_dev, st.st_ino):
                found.append(int(name))
                break
    return tuple(found)


def working_in(folder: Path) -> tuple[int, ...]:
    """Pids of processes on this machine whose working folder is ``folder`` (compilers a killed build left running
    there finish on their own; a new build must not write the same files meanwhile)."""
    try:
        want = os.stat(folder)
        pids = os.listdir("/proc")
    except OSError:
        return ()
    found = []
    for name in pids:
        if name.isdigit() and int(name) != os.getpid():
            try:
                cwd = os.stat(f"/proc/{name}/cwd")
            except OSError:
                continue
            if (cwd.st_dev, cwd.st_ino) == (want.st_dev, want.st_ino):
                found.append(int(name))
    return tuple(found)


def stale_message(baton: Path) -> str:
    """The one line that says a dead builder's baton was cleared."""
    return (f"cleared a stale JIT build lock {baton}: the process that took it is gone (no process on this machine "
            "holds it), and every DeepSpeed start would have waited on it")


def user_folder_error(baton: Path) -> InputError:
    """The one-line error for a dead-looking baton in a folder ampe does not own (it deletes nothing there)."""
    return InputError(ENV, "", f"{baton} is a JIT build lock no process on this machine holds: a build killed "
                      "midway leaves it, and every DeepSpeed start waits on it forever. ampe deletes nothing in a "
                      f"{ENV} it did not make: delete the lock if no build runs on another host or container "
                      f"sharing {baton.parent.parent}, or unset {ENV} to let ampe use its own folder")


def clear_stale(ext: ExtensionsDir, say: Say, quiet_s: float | None = None, poll_s: float = POLL_S,
                sleep: Callable[[float], None] = time.sleep) -> Sweep:
    """Deal with every baton in ``ext``; call it with :func:`build_lock` held. A baton some process on this machine
    holds is live (returned). One no process holds is watched for ``quiet_s`` seconds; if it is still the same file
    and still unheld, its builder is dead: in ampe's own folder it is deleted (``say`` gets :func:`stale_message`)
    and the op's ready mark with it (the build may have been cut off; ninja redoes what is missing); in the user's
    folder :func:`user_folder_error` is raised. Without ``/proc`` nothing counts as dead. ``quiet_s`` defaults to
    :data:`QUIET_S`."""
    quiet_s = QUIET_S if quiet_s is None else quiet_s
    cleared: list[Path] = []
    live: list[Baton] = []
    for baton in batons(ext):
        seen: tuple[int, int] | None = None
        since = 0.0
        while True:
            try:
                st = os.stat(baton)
            except FileNotFoundError:
                break  # released meanwhile
            if (st.st_dev, st.st_ino) != seen:
                seen, since = (st.st_dev, st.st_ino), time.monotonic()
            pids = holders(baton, st)
            if pids is None or pids:
                live.append(Baton(baton, pids or ()))
                break
            if time.monotonic() - since >= quiet_s:
                if not ext.owned:
                    raise user_folder_error(baton)
                with contextlib.suppress(FileNotFoundError):
                    now = os.stat(baton)
                    if (now.st_dev, now.st_ino) == seen:
                        os.unlink(baton)
                        (baton.parent / READY_FILE).unlink(missing_ok=True)
                        cleared.append(baton)
                        say(stale_message(baton))
                break
            sleep(poll_s)
    return Sweep(tuple(cleared), tuple(live))


def wait_for_batons(ext: ExtensionsDir, say: Say, quiet_s: float | None = None, poll_s: float = 0.5,
                    sleep: Callable[[float], None] = time.sleep) -> tuple[Path, ...]:
    """With :func:`build_lock` held: clear dead builders' batons (:func:`clear_stale`) and wait while live
    processes hold one (saying once whom it waits for), until no baton is left and no process works in the op's
    build folder (compilers of a build killed midway, :func:`working_in`). If a holder dies while it is waited on,
    its baton is cleared too. Returns the batons cleared."""
    cleared: list[Path] = []
    said = False
    while True:
        sweep = clear_stale(ext, say, quiet_s, sleep=sleep)
        cleared += sweep.cleared
        if sweep.live:
            who = ", ".join(f"{b.path} (pid {', '.join(map(str, b.holders)) or '?'})" for b in sweep.live)
            what = f"waiting for a running build to release {who}"
        else:
            workers = working_in(ext.op_dir)
            if not workers:
                return tuple(cleared)
            what = (f"waiting for processes still working in {ext.op_dir} (pid {', '.join(map(str, workers))}), "
                    "left by a build that was stopped")
        if not said:
            say(what)
            said = True
        sleep(poll_s)


def sweep_unlocked(ext: ExtensionsDir, say: Say, quiet_s: float | None = None) -> Sweep:
    """Before a start: when ``ext`` has batons and no ampe process holds the build lock, :func:`clear_stale`
    (which may watch a baton for ``quiet_s``); a batonless folder costs one ``glob`` and takes no lock."""
    if not batons(ext):
        return Sweep((), ())
    with build_lock(ext, wait=False) as got:
        if not got:  # an ampe build runs: its baton is live
            return Sweep((), ())
        return clear_stale(ext, say, quiet_s)
