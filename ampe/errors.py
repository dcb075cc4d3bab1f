"""The one error type for bad user input.

Every loader raises :class:`InputError` naming the file and the field; the CLI prints it as a single line and exits
with status 2. Nothing else in ampe should turn bad input into a traceback.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any


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


def suggest(word: str, known: typing.Iterable[str]) -> str | None:
    """The known name closest to ``word``, compared without case and punctuation (``a100`` → ``A100-40GB``,
    ``RTX-4090`` → ``RTX3090``, ``llama3-8b`` → ``llama-3.1-8b``); None when none is close (difflib ratio < 0.6).
    Only ever a hint: nothing is taken in its place."""
    def squash(name: str) -> str:
        return "".join(c for c in name.lower() if c.isalnum())

    by_squashed: dict[str, str] = {}
    for name in known:
        by_squashed.setdefault(squash(name), name)
    target = squash(word)
    prefixed = sorted(n for s, n in by_squashed.items() if target and s.startswith(target))
    if prefixed:
        return prefixed[0]
    close = difflib.get_close_matches(target, list(by_squashed), n=1, cutoff=0.6)
    return by_squashed[close[0]] if close else None


def field_path(loc: tuple | list) -> str:
    """Render a pydantic/JSON location such as ``("nodes", 0, "gpu")`` as ``nodes[0].gpu``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(root)"


def from_pydantic(source: str, exc: Exception, model: Any = None) -> InputError:
    """Turn a pydantic ValidationError into an InputError naming the failing field :func:`pydantic_first` picks
    (``model``: the validated class, for a did-you-mean hint on an unknown key)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        loc, msg = pydantic_first(errors(), model)
        return InputError(source, field_path(loc), msg)
    return InputError(source, "", str(exc))


UNKNOWN_KEY = "extra_forbidden"  # pydantic's error type for a key the model does not have


def pydantic_first(errors: list[Any], model: Any = None) -> tuple[list[Any], str]:
    """The error worth showing of a pydantic error list, as (location, message): an unknown key before any other (a
    misspelled ``intra_gpbs`` also leaves ``intra_gbps`` missing, and "intra_gbps: Field required" would hide the
    typo), with the closest known key at that place as a hint (from the other errors' missing keys and from
    ``model``'s fields); else the first error."""
    unknown = [e for e in errors if e.get("type") == UNKNOWN_KEY]
    first = unknown[0] if unknown else errors[0]
    loc = [p for p in first.get("loc", ()) if p not in ("function-after", "function-before")]
    if not unknown:  # a validator's ValueError reads as its own words (a plausible range, a contradiction)
        return loc, str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    key, parent = str(loc[-1]) if loc else "", loc[:-1]
    missing = [str(e["loc"][-1]) for e in errors
               if e.get("type") == "missing" and list(e.get("loc", ()))[:-1] == parent]
    known = missing + [f for f in _fields_at(model, parent) if f not in missing]
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else (f" (known: {', '.join(known)})" if known else "")
    return loc, f"unknown key{hint}"


def _fields_at(model: Any, parent: list[Any]) -> list[str]:
    """The field names of the pydantic model reached from ``model`` by the location ``parent`` (list indices and
    dict keys stepped over); none where it cannot be followed."""
    current, skip = model, 0
    for part in parent:
        if skip:  # a list index or a dict key
            skip -= 1
            continue
        fields = getattr(current, "model_fields", None)
        if not isinstance(part, str) or not fields or part not in fields:
            return []
        current, skip = _element(fields[part].annotation)
    return list(getattr(current, "model_fields", None) or ())


def _element(annotation: Any) -> tuple[Any, int]:
    """The model a field holds (through Optional, list[...] and dict[..., ...]) and how many location parts (index,
    key) come before its fields."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Union or isinstance(annotation, types.UnionType):
        for arg in args:
            if arg is not type(None):
                return _element(arg)
    if origin is list and args:
        inner, skip = _element(args[0])
        return inner, skip + 1
    if origin is dict and len(args) == 2:
        inner, skip = _element(args[1])
        return inner, skip + 1
    return annotation, 0
