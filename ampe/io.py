"""Safe file readers and atomic writers shared by every stage.

Reading: only regular files (never a FIFO, a device or ``/proc``'s endless files), at most :data:`MAX_INPUT_BYTES`,
nested at most :data:`MAX_NESTING` deep; YAML with ``yaml.safe_load`` and JSON with ``json.loads`` only (NaN and
Infinity literals refused) — nothing a user supplies is ever evaluated. Every failure becomes an
:class:`~ampe.errors.InputError` naming the file.

Writing: :func:`check_output_path` before any work starts; :func:`write_text_atomic` writes through a temporary file
and ``os.replace``, so readers never see half a file. An output path may be missing or an existing *regular*,
writable file; a symbolic link is followed to its target (which must itself qualify); a directory, a device, a FIFO
or a read-only file is refused. ``-`` means standard output.
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

from ampe.errors import InputError

MAX_INPUT_BYTES = 64 << 20  # specs, models, profiles, plans and measurements are far smaller; raise it here if needed
MAX_NESTING = 64  # no ampe input nests deeper than a few levels
STDOUT = "-"


def read_text(path: str | Path, lenient: bool = False) -> str:
    """The text of a regular file of at most MAX_INPUT_BYTES, or an InputError saying why it cannot be read.

    A leading UTF-8 byte-order mark is dropped. Text that is not UTF-8 is refused, unless ``lenient``: then each
    undecodable byte becomes a lone surrogate (U+DC80..U+DCFF; :func:`undecodable`) for a line-by-line reader to
    refuse only the lines holding one."""
    name = str(path)
    if not name:
        raise InputError("(empty path)", "", "no file named")
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise InputError(name, "", "file not found") from None
    except OSError as e:
        raise InputError(name, "", f"cannot read file ({type(e).__name__})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise InputError(name, "", f"cannot read: {kind}")
    if st.st_size > MAX_INPUT_BYTES or _is_proc(p):
        raise InputError(name, "", f"larger than {MAX_INPUT_BYTES >> 20} MiB (or a kernel file); not an ampe input")
    try:
        with p.open("rb") as f:
            data = f.read(MAX_INPUT_BYTES + 1)
    except OSError as e:
        raise InputError(name, "", f"cannot read file ({type(e).__name__})") from None
    if len(data) > MAX_INPUT_BYTES:
        raise InputError(name, "", f"larger than {MAX_INPUT_BYTES >> 20} MiB; not an ampe input")
    # A leading byte-order mark (some Windows editors write one) is not part of the text.
    if lenient:  # undecodable bytes become lone surrogates (U+DC80..U+DCFF) for the caller to refuse line by line
        return data.decode("utf-8-sig", errors="surrogateescape")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(name, "", "not UTF-8 text") from None


_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")


def undecodable(text: str) -> bool:
    """Whether ``text`` (from ``read_text(..., lenient=True)``) holds bytes that were not UTF-8."""
    return _ESCAPED_BYTE.search(text) is not None


def csv_records(source: str, text: str, required: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """(row number, stripped cells by column name) of every non-blank row of a CSV ``text`` with a header line.

    Ambiguity is an :class:`InputError` naming ``source`` and the field, never a silent choice: a column named twice,
    a missing ``required`` column, a row with more non-empty cells than the header (an unquoted comma would shift
    every column after it) or with no cell for a required column, and anything the csv module refuses (such as a
    field above its size limit). Short rows leave their trailing optional columns out of the dict; unnamed columns
    and empty cells past the header (trailing commas) are ignored. Rows are numbered as lines of a file without
    quoted line breaks (the header is row 1)."""
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


def _is_proc(p: Path) -> bool:
    with contextlib.suppress(OSError):
        return p.resolve().parts[1:2] in (("proc",), ("sys",))
    return False


def read_yaml(path: str | Path) -> Any:
    """Parse a YAML file with ``safe_load`` (nesting bounded)."""
    import yaml  # lazily: commands that read no YAML (``ampe frontier --profile``) skip its import

    text = read_text(path)
    try:
        doc = yaml.safe_load(text)
    except RecursionError:
        raise InputError(str(path), "", f"nested deeper than {MAX_NESTING} levels") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "syntax"
        problem = getattr(e, "problem", None) or "invalid YAML"
        raise InputError(str(path), where, f"YAML syntax error: {problem}") from None
    _check_depth(doc, str(path))
    return doc


def read_json(path: str | Path) -> Any:
    """Parse a JSON file (never evaluated; NaN/Infinity refused; nesting bounded)."""
    return parse_json(read_text(path), str(path))


def parse_json(text: str, source: str) -> Any:
    """Parse JSON text from ``source`` as :func:`read_json` does."""
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise InputError(source, "", f"nested deeper than {MAX_NESTING} levels") from None
    except ValueError as e:
        if isinstance(e, json.JSONDecodeError):
            raise InputError(source, f"line {e.lineno}", f"JSON syntax error: {e.msg}") from None
        raise InputError(source, _constant_field(text), str(e)) from None
    _check_depth(doc, source)
    return doc


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number ampe accepts (JSON has no NaN or Infinity)")


_CONSTANT = re.compile(r"-?(?:Infinity|NaN)\b")
_KEY_BEFORE = re.compile(r'"((?:[^"\\]|\\.){1,200})"\s*:\s*$')  # a key, then the ':' right before a value


def _constant_field(text: str) -> str:
    """Where the first NaN/Infinity of a JSON text is: the key it is the value of, else its line. A best effort
    for the error message (a NaN inside a string could mislead it; the parse refuses the text either way); it looks
    only at the 420 characters before the constant, so it costs the same on any size of text."""
    bare = _CONSTANT.search(text)
    if bare is None:
        return ""
    key = _KEY_BEFORE.search(text[max(0, bare.start() - 420):bare.start()])
    return key.group(1) if key is not None else f"line {text.count(chr(10), 0, bare.start()) + 1}"


def _check_depth(doc: Any, source: str) -> None:
    stack = [(doc, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_NESTING:
            raise InputError(source, "", f"nested deeper than {MAX_NESTING} levels")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def check_output_path(path: str | Path, flag: str = "--out") -> None:
    """Refuse an output path before any work starts: it must be ``-``, missing, or a regular writable file (a
    symbolic link counts as its target), in an existing folder ampe may create files in. Raises InputError."""
    name = str(path)
    if name == STDOUT:
        return
    if not name or name.endswith(os.sep):
        raise InputError(flag, "", f"{name!r} is not a file path")
    p = Path(path)
    target = p.resolve() if p.is_symlink() else p
    try:
        st = target.stat()
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise InputError(flag, "", f"{name}: cannot use as an output ({type(e).__name__})") from None
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


def write_text_atomic(path: str | Path, text: str, fsync: bool = False) -> None:
    """Write text through a temporary file and ``os.replace``; with ``fsync`` the data is on disk before the rename
    (durable across a power loss, not only atomic). ``-`` writes to standard output. A symbolic link is written
    through (its target is replaced); anything but a regular file or a missing path is refused (InputError)."""
    if str(path) == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    write_bytes_atomic(path, text.encode(), fsync)


def write_bytes_atomic(path: str | Path, data: bytes, fsync: bool = False) -> None:
    """:func:`write_text_atomic` for bytes (pictures); ``-`` writes them to standard output."""
    if str(path) == STDOUT:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    path = Path(path)
    if path.is_symlink():
        path = path.resolve()
    if path.exists() and not path.is_file():
        raise InputError(str(path), "", "not a regular file; ampe only replaces regular files")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    try:
        # mkstemp creates 0600; give the file the mode a plain open() would (0666 less the umask)
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
