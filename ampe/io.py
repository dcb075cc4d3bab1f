"""Safe file readers and atomic writers shared by every stage.

Reading: only regular files (never a FIFO, a device or ``/proc``'s endless files), at most :data:`MAX_INPUT_BYTES`,
nested at most :data:`MAX_NESTING` deep; YAML with a safe loader and JSON with ``json.loads`` only (NaN and
Infinity literals refused), both counted before they are built and refusing a key given twice (:mod:`ampe.parsers`)
— nothing a user supplies is ever evaluated. Every failure becomes an
:class:`~ampe.errors.InputError` naming the file.

Writing: :func:`check_output_path` before any work starts; :func:`write_text_atomic` writes through a temporary file
and ``os.replace``, so readers never see half a file. An output path may be missing or an existing *regular*,
writable file; a directory, a device, a FIFO or a read-only file is refused, and so is a symbolic link: the one link
policy of every output file, here and in :class:`ampe.outfolder.OutputFolder` (:func:`link_refusal`), is that ampe
neither writes through a link nor replaces it. ``-`` means standard output.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import stat
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ampe.errors import InputError, OutputError, os_reason
from ampe.parsers import MAX_NESTING, parse_json, parse_yaml  # noqa: F401  (parse_json, MAX_NESTING: re-exported)

MAX_INPUT_BYTES = 64 << 20  # specs, models, profiles, plans and measurements are far smaller; raise it here if needed
MAX_YAML_BYTES = 8 << 20  # cluster specs, models and host maps are kilobytes (a 10,000-layer model listed layer by
# layer is 1.5 MB); the node budget (ampe.parsers.MAX_YAML_NODES) bounds the work below this size
MAX_CSV_ROWS = 200_000  # a per-layer profile of an 80-layer model over 8 micro-batch sizes, 2 kernels, 3 recompute
# modes and 4 TP degrees is 15,000 rows; 200,000 rows parse in a few seconds (1.8 million took 41 s)
STDOUT = "-"


def read_text(path: str | Path, lenient: bool = False, limit: int = MAX_INPUT_BYTES) -> str:
    """The text of a regular file of at most ``limit`` bytes (default MAX_INPUT_BYTES), or an InputError saying why
    it cannot be read.

    A leading UTF-8 byte-order mark is dropped. Text that is not UTF-8 is refused, unless ``lenient``: then each
    undecodable byte becomes a lone surrogate (U+DC80..U+DCFF; :func:`undecodable`) for a line-by-line reader to
    refuse only the lines holding one."""
    name = str(path)
    if not name:
        raise InputError("(empty path)", "", "no file named")
    bad = path_problem(name)
    if bad:
        raise InputError(name, "", f"not a usable file name: {bad}")
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise InputError(name, "", "file not found") from None
    except OSError as e:
        raise InputError(name, "", f"cannot read file ({os_reason(e)})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise InputError(name, "", f"cannot read: {kind}")
    if st.st_size > limit or _is_proc(p):
        raise InputError(name, "", f"larger than {limit >> 20} MiB (or a kernel file); not an ampe input")
    try:
        # O_NONBLOCK: a path swapped for a FIFO after the check above must not block the open (nor the read: the
        # descriptor is checked again, then read only if it is a regular file)
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise InputError(name, "", "cannot read: not a regular file (it changed while ampe read it)")
            os.set_blocking(fd, True)
            data = f.read(limit + 1)
    except OSError as e:
        raise InputError(name, "", f"cannot read file ({os_reason(e)})") from None
    if len(data) > limit:
        raise InputError(name, "", f"larger than {limit >> 20} MiB; not an ampe input")
    # A leading byte-order mark (some Windows editors write one) is not part of the text.
    if lenient:  # undecodable bytes become lone surrogates (U+DC80..U+DCFF) for the caller to refuse line by line
        return data.decode("utf-8-sig", errors="surrogateescape")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(name, "", "not UTF-8 text") from None


_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")
_CONTROL = re.compile("[\x00-\x1f\x7f]")
NAME_MAX = 255  # bytes in one path component (Linux, macOS); longer names are refused before the system call


def path_problem(name: str) -> str | None:
    """Why ``name`` cannot be a file name ampe uses, or None: a NUL byte (no system call takes one), a line break or
    other control character (it would split the lines and shell commands ampe writes about the file), or a
    component over NAME_MAX bytes."""
    if "\x00" in name:
        return "it holds a NUL byte"
    m = _CONTROL.search(name)
    if m is not None:
        return f"it holds the control character {m.group()!r} (a line break?)"
    try:
        longest = max((len(part.encode("utf-8", "surrogateescape")) for part in name.split(os.sep)), default=0)
    except UnicodeError:
        return "it is not encodable as a file name"
    if longest > NAME_MAX:
        return f"a name in it is {longest} bytes long (at most {NAME_MAX})"
    return None


def undecodable(text: str) -> bool:
    """Whether ``text`` (from ``read_text(..., lenient=True)``) holds bytes that were not UTF-8."""
    return _ESCAPED_BYTE.search(text) is not None


def exists(path: str | Path) -> bool:
    """Whether ``path`` names something, never raising: a name with a NUL byte, one too long for the system or a
    symbolic-link loop is simply not there (``Path.exists`` raises for them); the reader that opens it says why."""
    try:
        return Path(path).exists()
    except (OSError, ValueError):
        return False


def csv_records(source: str, text: str, required: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """(row number, stripped cells by column name) of every non-blank row of a CSV ``text`` with a header line.

    At most :data:`MAX_CSV_ROWS` rows, counted before any is parsed. Ambiguity is an :class:`InputError` naming
    ``source`` and the field, never a silent choice: a column named twice, a missing ``required`` column, a row with
    more non-empty cells than the header (an unquoted comma would shift every column after it) or with no cell for a
    required column, and anything the csv module refuses (such as a field above its size limit). Short rows leave
    their trailing optional columns out of the dict; unnamed columns and empty cells past the header (trailing
    commas) are ignored. Rows are numbered as lines of a file without quoted line breaks
    (the header is row 1)."""
    lines = text.count("\n") + 1  # at least the rows (a quoted line break can only over-count), at C speed
    if lines > MAX_CSV_ROWS + 1:
        raise InputError(source, "", f"{lines:,} lines; ampe reads at most {MAX_CSV_ROWS:,} rows from a CSV file")
    reader = csv.reader(io.StringIO(text))  # plain rows: csv.DictReader costs about 3x as much per row
    try:
        header = [h.strip() for h in next(reader, [])]
        named = [h for h in header if h]  # unnamed columns (a spreadsheet's trailing commas) are never read
        dup = next((h for h in named if named.count(h) > 1), None)
        if dup is not None:
            raise InputError(source, dup, "column appears twice in the header")
        missing = [c for c in required if c not in header]
        if missing:
            raise InputError(source, missing[0], f"missing column (need {', '.join(required)})")
        for rowno, cells in enumerate(reader, start=2):
            if not any(c.strip() for c in cells):
                continue
            if len(cells) > len(header) and any(c.strip() for c in cells[len(header):]):
                raise InputError(source, f"row {rowno}", f"{len(cells)} cells for {len(header)} columns (an "
                                 "unquoted comma?)")
            absent = next((c for c in required if header.index(c) >= len(cells)), None)
            if absent is not None:
                raise InputError(source, f"row {rowno}", f"{len(cells)} cells: no {absent!r} value")
            yield rowno, {h: c.strip() for h, c in zip(header, cells, strict=False) if h}
    except csv.Error as e:
        raise InputError(source, f"line {reader.line_num}", f"not a valid CSV file ({e})") from None


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two names are one file: equal resolved paths (a symbolic link and its target, ``x`` and ``./x``), or,
    where both exist, the same device and inode (a hard link). A name ending in ``/`` is a whole folder: any file
    within it counts. Never raises; a name that cannot be resolved is no file."""
    try:
        if str(a).endswith(os.sep):
            folder, other = os.path.realpath(a), os.path.realpath(b)
            return other == folder or other.startswith(folder.rstrip(os.sep) + os.sep)
        if os.path.realpath(a) == os.path.realpath(b):
            return True
        sa, sb = os.stat(a), os.stat(b)
    except (OSError, ValueError):
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _is_proc(p: Path) -> bool:
    with contextlib.suppress(OSError):
        return p.resolve().parts[1:2] in (("proc",), ("sys",))
    return False


def read_yaml(path: str | Path) -> Any:
    """Parse a YAML file of at most MAX_YAML_BYTES safely, its work bounded (:func:`ampe.parsers.parse_yaml`: nodes
    and aliases counted, nesting bounded, duplicate keys refused)."""
    return parse_yaml(read_text(path, limit=MAX_YAML_BYTES), str(path))


def read_json(path: str | Path) -> Any:
    """Parse a JSON file (never evaluated; NaN/Infinity refused; values counted; nesting bounded; duplicate keys
    refused: :func:`ampe.parsers.parse_json`)."""
    return parse_json(read_text(path), str(path))


def check_output_path(path: str | Path, flag: str = "--out") -> None:
    """Refuse an output path before any work starts: it must be ``-``, missing, or a regular writable file (a
    symbolic link counts as its target), in an existing folder ampe may create files in, with a name a system call
    takes and a line of text can hold (:func:`path_problem`); never a symbolic link (:func:`link_refusal`). Raises
    InputError."""
    name = str(path)
    if name == STDOUT:
        return
    if not name or name.endswith(os.sep):
        raise InputError(flag, "", f"{name!r} is not a file path")
    bad = path_problem(name)
    if bad:
        raise InputError(flag, "", f"{name!r} is not a usable file name: {bad}")
    try:
        _check_output_target(Path(path), name, flag)
    except (OSError, RuntimeError) as e:  # a symbolic-link loop (RuntimeError from Path.resolve), a name too long
        reason = os_reason(e) if isinstance(e, OSError) else "a loop of symbolic links"
        raise InputError(flag, "", f"{name}: cannot use as an output ({reason})") from None


def _check_output_target(p: Path, name: str, flag: str) -> None:
    if p.is_symlink():
        raise InputError(flag, "", link_refusal(name))
    target = p
    try:
        st = target.stat()
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise InputError(flag, "", f"{name} is {kind}; ampe only replaces regular files")
        if not os.access(target, os.W_OK) or not st.st_mode & stat.S_IWUSR:
            raise InputError(flag, "", f"{name} is read-only; ampe does not overwrite it")
    parent = target.parent
    if not parent.is_dir():
        raise InputError(flag, "", f"{name}: folder {parent} does not exist (or is not a folder)")
    if _is_proc(parent / target.name):
        raise InputError(flag, "", f"{name}: not a place for output files")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(flag, "", f"{name}: cannot create files in {parent}")


def link_refusal(name: str | Path) -> str:
    """The one line refusing an output file that is a symbolic link (every writer's policy: never write through a link
    — its target may be anyone's file — and never replace it — the user put it there)."""
    return f"{name} is a symbolic link; ampe neither writes through nor replaces one (remove it or name another file)"


def check_output_folder(path: str | Path, flag: str = "--out") -> None:
    """Refuse an output *folder* (``ampe trial --out``, ``ampe export --out``) before any work starts: a usable name
    (:func:`path_problem`), and either missing (it is created, with its parents) or an existing folder — never a
    file, a device (``/dev/full``), a link to nothing or a link loop. Raises InputError."""
    name = str(path)
    if not name:
        raise InputError(flag, "", "no folder named")
    bad = path_problem(name)
    if bad:
        raise InputError(flag, "", f"{name!r} is not a usable folder name: {bad}")
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        st = None
    except (OSError, RuntimeError) as e:
        reason = os_reason(e) if isinstance(e, OSError) else "a loop of symbolic links"
        raise InputError(flag, "", f"{name}: cannot use as an output folder ({reason})") from None
    if st is None and p.is_symlink():  # creating it would create the link's target, wherever that is
        raise InputError(flag, "", f"{name} is a symbolic link to nothing; ampe creates no folder through it")
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise InputError(flag, "", f"{name} exists and is not a folder")
    if _is_proc(p):
        raise InputError(flag, "", f"{name}: not a place for output files")
    if st is not None and not os.access(p, os.W_OK | os.X_OK):
        raise InputError(flag, "", f"{name}: cannot create files in it")


PICTURE_SUFFIXES = (".png", ".svg", ".pdf")


def check_picture_path(path: str | Path, flag: str) -> None:
    """:func:`check_output_path` for a picture: the suffix picks the format (``.png``, ``.svg`` or ``.pdf``)."""
    check_output_path(path, flag)
    if str(path) != STDOUT and Path(path).suffix.lower() not in PICTURE_SUFFIXES:
        raise InputError(flag, "", f"{path}: the file name must end in {', '.join(PICTURE_SUFFIXES)} (the format)")


def write_json_atomic(path: str | Path, obj: Any, indent: int | None = 2) -> None:
    """Write :func:`json_text` through a temporary file and ``os.replace`` so readers never see a half-written
    file."""
    write_text_atomic(path, json_text(obj, indent) + "\n")


def json_text(obj: Any, indent: int | None = 2) -> str:
    """JSON text of ``obj`` (NaN and Infinity refused). With ``indent``, objects and lists of objects are indented,
    but a list whose first item is a scalar or a list of scalars is written on one line: partitions, placements and
    each stage of a frequency plan (a 1,024-GPU plan is 6 MB instead of 29 MB one number per line, and is written
    8x faster)."""
    if indent is None:
        return json.dumps(obj, allow_nan=False)
    lines: list[str] = []
    token = f"@ampe-json-{uuid.uuid4().hex}-"  # a string no input can hold by chance

    def one_line(x: list | tuple) -> bool:
        first = x[0]
        if isinstance(first, (list, tuple)):
            return not first or not isinstance(first[0], (dict, list, tuple))
        return not isinstance(first, dict)

    def skeleton(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: skeleton(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            if x and one_line(x):
                lines.append(json.dumps(x, allow_nan=False))
                return f"{token}{len(lines) - 1}"
            return [skeleton(v) for v in x]
        return x

    text = json.dumps(skeleton(obj), indent=indent, allow_nan=False)
    if not lines:
        return text
    return re.sub(f'"{re.escape(token)}(\\d+)"', lambda m: lines[int(m.group(1))], text)


def _umask() -> int:
    """The process umask, read without changing it where Linux shows it (os.umask would set it, racing threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def fill_new_file(fd: int, data: bytes, mode: int, fsync: bool = False) -> None:
    """Give a just-created temporary file (descriptor ``fd``, closed here) ``mode`` less the umask — on the descriptor,
    so no ``chmod`` can follow a link — and its ``data``; with ``fsync`` on disk before the caller renames it."""
    os.fchmod(fd, mode & ~_umask() & 0o7777)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def write_text_atomic(path: str | Path, text: str, fsync: bool = False) -> None:
    """Write text through a temporary file and ``os.replace``; with ``fsync`` the data is on disk before the rename
    (durable across a power loss, not only atomic). ``-`` writes to standard output (strictly in its encoding: data
    is never written with characters replaced). A symbolic link is refused (:func:`link_refusal`), as is anything but
    a regular file or a missing path. A write that fails (disk full, file-size limit, a
    closed pipe) is an InputError naming the file, and leaves nothing behind."""
    if str(path) == STDOUT:
        encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
        try:
            text.encode(encoding)
        except (UnicodeEncodeError, LookupError):
            raise InputError("standard output", "", f"the data holds characters its encoding ({encoding}) cannot "
                             "write; set PYTHONIOENCODING=utf-8 or write to a file") from None
        _to_stdout(lambda: sys.stdout.write(text))
        return
    write_bytes_atomic(path, text.encode(), fsync)


def _to_stdout(write: Any) -> None:
    try:
        write()
        sys.stdout.flush()
    except OSError as e:
        raise OutputError("standard output", "", f"cannot write ({os_reason(e)})") from None


def write_bytes_atomic(path: str | Path, data: bytes, fsync: bool = False) -> None:
    """:func:`write_text_atomic` for bytes (pictures); ``-`` writes them to standard output."""
    if str(path) == STDOUT:
        _to_stdout(lambda: sys.stdout.buffer.write(data))
        return
    name = str(path)
    path = Path(path)
    try:
        if path.is_symlink():
            raise OutputError(name, "", link_refusal(name))
        if path.exists() and not path.is_file():
            raise InputError(name, "", "not a regular file; ampe only replaces regular files")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:60]}.", dir=str(path.parent))
    except (OSError, RuntimeError, ValueError) as e:
        reason = os_reason(e) if isinstance(e, OSError) else str(e)
        raise OutputError(name, "", f"cannot write ({reason})") from None
    try:
        fill_new_file(fd, data, 0o666, fsync)  # mkstemp creates 0600: the mode a plain open() would give instead
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise OutputError(name, "", f"cannot write ({os_reason(e)}); nothing was written") from None
        raise
