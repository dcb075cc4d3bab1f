"""Output folders: many files written into one folder (``ampe export --out``, ``ampe trial --out``, a trial's job
folder) and never anywhere else.

The folder the user names is opened once (a link the user gave as the folder itself is followed: the user chose
it; a link to nothing is refused, so no folder is ever created through one). Everything below it is reached through
the open folder's descriptor (``dir_fd``), never by following a link:

* a file is written to a temporary file in the folder (``O_EXCL | O_NOFOLLOW``), given its mode while it is still
  the temporary file (``fchmod``: no ``chmod`` can follow a link), then renamed over the name. A symbolic link in
  the file's place is refused, one line, as every output file of ampe refuses one (:func:`ampe.io.link_refusal`:
  never written through, never replaced); so is a folder, FIFO or device;
* a subfolder is created with ``mkdir`` and opened with ``O_NOFOLLOW``: a link in its place is removed (the link,
  not its target) and a real folder made; :meth:`OutputFolder.fresh` first removes what was there
  (``shutil.rmtree`` on the descriptor: links inside are unlinked, never followed);
* an append-only log (``results.jsonl``, ``launcher.log``) is opened with ``O_NOFOLLOW``: a link there is refused with
  one line (replacing it would drop the records it holds).

Every failure is an :class:`~ampe.errors.OutputError` naming the path: one line, exit status 2.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import shutil
import stat
import uuid
from collections.abc import Collection
from pathlib import Path
from typing import Any

from ampe.errors import InputError, OutputError, os_reason
from ampe.io import check_output_folder, fill_new_file, json_text, link_refusal

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
CLOEXEC = getattr(os, "O_CLOEXEC", 0)
DIRECTORY = getattr(os, "O_DIRECTORY", 0)
NONBLOCK = getattr(os, "O_NONBLOCK", 0)
FILE_MODE = 0o666  # less the umask, as a plain open() creates files
EXEC_MODE = 0o777  # scripts (launch.sh): less the umask


class OutputFolder:
    """An open output folder. ``path``: as the user named it (made absolute, links in it resolved once when it is
    opened); every write goes through the open descriptor, so nothing below it is reached through a link."""

    def __init__(self, path: str | Path, flag: str = "--out", *, _fd: int | None = None) -> None:
        self.flag = flag
        self.fd = -1
        if _fd is not None:
            self.path = Path(path)
            self.fd = _fd
            return
        check_folder(path, flag)
        name = str(path)
        p = Path(path)
        try:
            if not p.exists():
                p.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(p, os.O_RDONLY | DIRECTORY | CLOEXEC)
            self.path = Path(os.path.realpath(p))
        except (OSError, RuntimeError) as e:
            reason = os_reason(e) if isinstance(e, OSError) else "a loop of symbolic links"
            raise OutputError(flag, "", f"{name}: cannot create or open the folder ({reason})") from None

    # -- context manager / lifetime ------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the folder's descriptor (idempotent)."""
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> OutputFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    # -- folders -------------------------------------------------------------------------------------------------
    def folder(self, name: str) -> OutputFolder:
        """The subfolder ``name`` (one or more components, ``a/b``), created where missing; a link in its place is
        replaced by a folder, a file there is refused."""
        current: OutputFolder = self
        for part in _parts(name):
            current = current._sub(part, fresh=False)
        return current

    def fresh(self, name: str) -> OutputFolder:
        """The subfolder ``name`` emptied: whatever was there (a folder and all in it, a file, a link) is removed
        first — links are unlinked, never followed — then an empty folder is made."""
        parts = _parts(name)
        parent = self.folder("/".join(parts[:-1])) if len(parts) > 1 else self
        return parent._sub(parts[-1], fresh=True)

    def _sub(self, part: str, fresh: bool) -> OutputFolder:
        where = self.path / part
        try:
            st = _lstat(part, self.fd)
            if st is not None and (fresh or not stat.S_ISDIR(st.st_mode)):
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(part, dir_fd=self.fd)
                elif stat.S_ISLNK(st.st_mode) or fresh:
                    os.unlink(part, dir_fd=self.fd)  # the link itself; its target is never touched
                else:
                    raise OutputError(str(where), "", "exists and is not a folder; ampe does not replace it")
                st = None
            if st is None:
                os.mkdir(part, 0o777, dir_fd=self.fd)
            fd = os.open(part, os.O_RDONLY | DIRECTORY | NOFOLLOW | CLOEXEC, dir_fd=self.fd)
        except OSError as e:
            if e.errno == errno.ELOOP:  # a link planted between the check and the open
                raise OutputError(str(where), "", "became a symbolic link while ampe wrote; nothing written through "
                                  "it") from None
            raise OutputError(str(where), "", f"cannot create the folder ({os_reason(e)})") from None
        return OutputFolder(where, self.flag, _fd=fd)

    # -- files ---------------------------------------------------------------------------------------------------
    def write_text(self, name: str, text: str, mode: int = FILE_MODE, fsync: bool = False) -> Path:
        """Write ``text`` (UTF-8) to ``name`` atomically (see the module docstring); return its path."""
        return self.write_bytes(name, text.encode(), mode, fsync)

    def write_json(self, name: str, obj: Any, indent: int | None = 2, fsync: bool = False) -> Path:
        """Write :func:`ampe.io.json_text` of ``obj`` (and a line break) to ``name``; return its path."""
        return self.write_text(name, json_text(obj, indent) + "\n", fsync=fsync)

    def write_bytes(self, name: str, data: bytes, mode: int = FILE_MODE, fsync: bool = False) -> Path:
        """Write ``data`` to ``name`` through a temporary file renamed over it; ``mode`` less the umask. A link at
        ``name`` is refused (never followed, never replaced), as is anything but a regular file there."""
        parts = _parts(name)
        folder = self.folder("/".join(parts[:-1])) if len(parts) > 1 else self
        return folder._write(parts[-1], data, mode, fsync)

    def _write(self, part: str, data: bytes, mode: int, fsync: bool) -> Path:
        where = self.path / part
        self._refuse_non_file(part, where)
        tmp = f".{part[:60]}.{uuid.uuid4().hex[:12]}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | CLOEXEC, 0o600, dir_fd=self.fd)
        except OSError as e:
            raise OutputError(str(where), "", f"cannot write ({os_reason(e)})") from None
        try:
            fill_new_file(fd, data, mode, fsync)
            self._refuse_non_file(part, where)
            os.replace(tmp, part, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)
            if isinstance(e, OSError):
                raise OutputError(str(where), "", f"cannot write ({os_reason(e)}); nothing was written") from None
            raise
        return where

    def check_files(self, names: list[str]) -> None:
        """Refuse, before anything is written, any of ``names`` (files to write, ``a/b`` allowed) that is a link, a
        folder or not a regular file, so a refused write leaves the folder as it was."""
        for name in names:
            parts = _parts(name)
            here = self.path.joinpath(*parts[:-1])
            try:
                sub = os.open("/".join(parts[:-1]) or ".", os.O_RDONLY | DIRECTORY | NOFOLLOW | CLOEXEC, dir_fd=self.fd)
            except OSError:  # a missing subfolder holds nothing to refuse; a link there is replaced by a folder
                continue
            with OutputFolder(here, self.flag, _fd=sub) as folder:  # closes ``sub``
                folder._refuse_non_file(parts[-1], here / parts[-1])

    def remove_stale(self, pattern: str, keep: Collection[str]) -> list[str]:
        """Remove the files and links directly in the folder whose names match ``pattern`` (``fnmatch``) but are not
        in ``keep``: what an earlier run wrote that this one does not (a link is unlinked, never followed; a folder
        is left). Returns the names removed."""
        gone = []
        for name in sorted(os.listdir(self.fd)):
            if fnmatch.fnmatchcase(name, pattern) and name not in keep:
                with contextlib.suppress(IsADirectoryError, PermissionError, FileNotFoundError):
                    os.unlink(name, dir_fd=self.fd)
                    gone.append(name)
        return gone

    def _refuse_non_file(self, part: str, where: Path) -> None:
        try:
            st = _lstat(part, self.fd)
        except OSError as e:
            raise OutputError(str(where), "", f"cannot write ({os_reason(e)})") from None
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise OutputError(str(where), "", link_refusal(part))
        if st is not None and not stat.S_ISREG(st.st_mode):
            kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise OutputError(str(where), "", f"is {kind}; ampe only replaces regular files")

    def open_append(self, name: str, read: bool = False) -> int:
        """A descriptor appending to ``name`` (created 0644 less the umask): a regular file only. A link there is
        refused — replacing it would lose what it holds — and so is a FIFO or device (never blocks on one)."""
        where = self.path / name
        flags = (os.O_RDWR if read else os.O_WRONLY) | os.O_CREAT | os.O_APPEND | NOFOLLOW | CLOEXEC | NONBLOCK
        try:
            fd = os.open(name, flags, 0o644, dir_fd=self.fd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise OutputError(str(where), "", "is a symbolic link; ampe appends only to a regular file in its "
                                  "folder (remove the link)") from None
            if e.errno == errno.ENXIO:  # a FIFO without a reader (O_NONBLOCK), a socket: no file to append to
                raise OutputError(str(where), "", "not a regular file; ampe appends only to regular files") from None
            raise OutputError(str(where), "", f"cannot open for appending ({os_reason(e)})") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OutputError(str(where), "", "not a regular file; ampe appends only to regular files")
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd


def check_folder(path: str | Path, flag: str = "--out") -> None:
    """Refuse an output folder before any work starts (:func:`ampe.io.check_output_folder`: a usable name, missing
    or a folder, not a link to nothing), and one to be created below a link to nothing (``mkdir -p`` would fail on
    it, or, through a resolved path, create the link's target). Raises InputError."""
    check_output_folder(path, flag)
    p = Path(path)
    for parent in Path(os.path.abspath(p)).parents:
        if parent.is_symlink() and not parent.exists():
            raise InputError(flag, "", f"{p}: {parent} is a symbolic link to nothing; ampe creates no folder "
                              "through it")
        if parent.exists():
            return


def _parts(name: str) -> list[str]:
    """The components of a relative name inside a folder; ``..``, absolute names and empty names are refused
    (a programming error, not user input)."""
    parts = [p for p in str(name).split("/") if p not in ("", ".")]
    if not parts or str(name).startswith("/") or ".." in parts:
        raise ValueError(f"not a name inside an output folder: {name!r}")
    return parts


def _lstat(part: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(part, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


__all__ = ["EXEC_MODE", "FILE_MODE", "OutputFolder", "check_folder"]
