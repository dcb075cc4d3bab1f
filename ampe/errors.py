"""The one error type for bad user input.

Every loader raises :class:`InputError` naming the file and the field; the CLI prints it as a single line and exits
with status 2. Nothing else in ampe should turn bad input into a traceback.
"""

from __future__ import annotations


class InputError(Exception):
    """Bad user input: ``source`` is a file path (or "--flag"), ``field`` the offending key, ``message`` why."""

    def __init__(self, source: str, field: str, message: str) -> None:
        source = str(source)  # a path with a line break or NUL in it must not break the one line
        self.source = _short(source if source.isprintable() else repr(source)[1:-1], MAX_SOURCE)
        field = str(field)
        self.field = _short(field if field.isprintable() else repr(field)[1:-1], MAX_FIELD)
        message = str(message)
        self.message = _short(" ".join((message if message.isprintable() else repr(message)[1:-1]).split()),
                              MAX_MESSAGE)
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.source}: {self.field}" if self.field else self.source
        return f"{where}: {self.message}"


class OutputError(InputError):
    """An output could not be written (disk full, file-size limit, a closed pipe): reported like bad input, one line
    naming the file (or "standard output"), exit status 2."""


def os_reason(e: OSError) -> str:
    """A system error in words (``No space left on device``), without the path it may repeat."""
    return e.strerror or type(e).__name__


MAX_SOURCE, MAX_FIELD, MAX_MESSAGE = 300, 200, 600  # one line stays readable whatever the input echoes back


def _short(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters (a 10 KB node name is not echoed back whole)."""
    return text if len(text) <= limit else f"{text[: limit - 20]}… ({len(text)} characters)"


def field_path(loc: tuple | list) -> str:
    """Render a pydantic/JSON location such as ``("nodes", 0, "gpu")`` as ``nodes[0].gpu``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(root)"


def from_pydantic(source: str, exc: Exception) -> InputError:
    """Turn a pydantic ValidationError into an InputError naming the first failing field."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        loc = [p for p in first.get("loc", ()) if p not in ("function-after", "function-before")]
        msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        return InputError(source, field_path(loc), msg)
    return InputError(source, "", str(exc))
