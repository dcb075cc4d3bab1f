"""Safe file readers and an atomic writer shared by every stage.

YAML is read with ``yaml.safe_load`` and JSON with ``json.loads`` only; nothing a user supplies is ever evaluated.
Every failure becomes an :class:`~ampe.errors.InputError` naming the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from ampe.errors import InputError


def read_text(path: str | Path) -> str:
    """The file's text, or an InputError saying why it cannot be read."""
    path = Path(path)
    try:
        return path.read_text()
    except FileNotFoundError:
        raise InputError(str(path), "", "file not found") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError, OSError) as e:
        raise InputError(str(path), "", f"cannot read file ({type(e).__name__})") from None


def read_yaml(path: str | Path) -> Any:
    """Parse a YAML file with ``safe_load``."""
    text = read_text(path)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "syntax"
        problem = getattr(e, "problem", None) or "invalid YAML"
        raise InputError(str(path), where, f"YAML syntax error: {problem}") from None


def read_json(path: str | Path) -> Any:
    """Parse a JSON file (never evaluated)."""
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(str(path), f"line {e.lineno}", f"JSON syntax error: {e.msg}") from None


def write_json_atomic(path: str | Path, obj: Any, indent: int | None = 2) -> None:
    """Write JSON through a temporary file and ``os.replace`` so readers never see a half-written file."""
    write_text_atomic(path, json.dumps(obj, indent=indent, allow_nan=False) + "\n")


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
    (durable across a power loss, not only atomic)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    try:
        # mkstemp creates 0600; give the file the mode a plain open() would (0666 less the umask)
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w") as f:
            f.write(text)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
