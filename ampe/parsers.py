"""YAML and JSON text to Python values, bounded by work and not only by size (the file readers are in ampe.io).

Every input is counted before it is built, so that no file under the 64 MiB cap can run for minutes or take
gigabytes before it is refused:

* YAML is first streamed as parser events (libyaml, in C, at about a microsecond an event) and counted: every
  scalar, list and mapping is one node, and an alias counts as the whole node it repeats, so a 700-byte "billion
  laughs" file is refused at once (:data:`MAX_YAML_NODES`). Nesting is counted in the same pass, aliases included.
  Only then is the document composed and built.
* JSON values are counted from the text before it is parsed (commas and brackets, at C speed; commas inside strings
  count too, which can only over-count): at most :data:`MAX_JSON_VALUES`.
* A key given twice in one YAML mapping or JSON object is refused with the key and its line, never settled by "the
  last one wins". (A YAML merge key ``<<`` may still be overridden: that is what it is for.)
* YAML 1.1's base-60 numbers are not numbers: ``count: 1:30`` is the text "1:30" (which a number field refuses),
  not 90, as in YAML 1.2.

Failures raise :class:`~ampe.errors.InputError` naming the source and the line.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

from ampe.errors import InputError

MAX_NESTING = 64  # no ampe input nests deeper than a few levels
MAX_YAML_NODES = 250_000  # expanded, aliases counted in full; ampe's YAML inputs (specs, models, host maps) hold
# hundreds to a few thousand nodes (a 16,384-device spec written out node by node: about 20,000; a model YAML listing
# 10,000 layers one by one, without ``repeat``: about 150,000)
MAX_JSON_VALUES = 8_000_000  # a 1,024-GPU plan is about 6 MB: at most 3 million values at two bytes a value


def parse_yaml(text: str, source: str) -> Any:
    """The one document of a YAML ``text`` from ``source``, counted (:func:`count_yaml`) before it is built, with
    duplicate keys and base-60 numbers refused."""
    import yaml  # lazily: commands that read no YAML (``ampe frontier --profile``) skip its import

    try:
        count_yaml(text, source)
        loader = _loader_class()(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except RecursionError:  # counted above; kept for a Python build with a very small stack
        raise InputError(source, "", f"nested deeper than {MAX_NESTING} levels") from None
    except _DuplicateKeyError as e:
        raise InputError(source, f"line {e.line}", f"key {e.key!r} appears twice in one mapping (first at line "
                         f"{e.first}); ampe does not pick one") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "syntax"
        problem = getattr(e, "problem", None) or "invalid YAML"
        raise InputError(source, where, f"YAML syntax error: {problem}") from None


def count_yaml(text: str, source: str) -> int:
    """The number of nodes of a YAML ``text`` with every alias expanded, streamed from parser events (no document
    is built). Refuses more than :data:`MAX_YAML_NODES` or a nesting deeper than :data:`MAX_NESTING`, as soon as
    the count passes it. Raises ``yaml.YAMLError`` for text that is not YAML."""
    import yaml

    anchored: dict[str, tuple[int, int]] = {}  # anchor -> (expanded nodes, height) of the node it names
    open_: list[list[Any]] = []  # per open collection: [expanded nodes seen when it opened, tallest child, anchor]
    total = 0  # expanded nodes so far
    loader = _event_loader_class()(text)
    try:
        while (event := loader.get_event()) is not None:
            line = event.start_mark.line + 1 if event.start_mark is not None else 0
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                open_.append([total, 0, event.anchor])
                total += 1
                if len(open_) > MAX_NESTING:
                    raise InputError(source, f"line {line}", f"nested deeper than {MAX_NESTING} levels")
            else:
                if isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                    before, height, anchor = open_.pop()
                    size, height = total - before, height + 1
                elif isinstance(event, yaml.ScalarEvent):
                    size, height, anchor = 1, 0, event.anchor
                    total += 1
                elif isinstance(event, yaml.AliasEvent):  # an unknown anchor counts 1: the composer refuses it
                    size, height = anchored.get(event.anchor or "", (1, 0))
                    anchor = None
                    total += size
                else:  # stream and document events
                    continue
                if anchor is not None:
                    anchored[anchor] = (size, height)
                if open_:
                    open_[-1][1] = max(open_[-1][1], height)
                if height + len(open_) > MAX_NESTING:
                    raise InputError(source, f"line {line}", f"nested deeper than {MAX_NESTING} levels (counting "
                                     "what its aliases repeat)")
            if total > MAX_YAML_NODES:
                raise InputError(source, f"line {line}", f"more than {MAX_YAML_NODES:,} YAML nodes (aliases "
                                 "counted in full); not an ampe input (an alias bomb?)")
    finally:
        loader.dispose()
    return total


class _DuplicateKeyError(Exception):
    def __init__(self, key: Any, line: int, first: int) -> None:
        super().__init__(key)
        self.key, self.line, self.first = key, line, first


_LOADERS: dict[str, Any] = {}


def _event_loader_class() -> Any:
    """libyaml's safe loader where the system has it (C speed), else PyYAML's own."""
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


_SEXAGESIMAL = re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$")


def _loader_class() -> Any:
    """A safe loader that refuses duplicate keys and reads base-60 numbers as text (built once)."""
    if "safe" in _LOADERS:
        return _LOADERS["safe"]
    import yaml
    from yaml.nodes import ScalarNode

    base = _event_loader_class()

    class Loader(base):  # type: ignore[valid-type, misc]
        """``safe_load``'s loader, less YAML 1.1's base-60 numbers, refusing a key given twice."""

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, yaml.MappingNode):
                first: dict[Any, int] = {}
                for key_node, _ in node.value:
                    if not isinstance(key_node, ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node)
                    line = key_node.start_mark.line + 1
                    try:
                        if key in first:
                            raise _DuplicateKeyError(key, line, first[key])
                    except TypeError:  # an unhashable key: SafeConstructor says so
                        continue
                    first[key] = line
            return super().construct_mapping(node, deep=deep)

        def construct_yaml_int(self, node: Any) -> Any:
            try:
                return super().construct_yaml_int(node)
            except ValueError:  # Python's limit on digits in int(): no ampe number is anywhere near it
                raise yaml.constructor.ConstructorError(
                    None, None, f"an integer of {len(node.value):,} characters; not a number ampe accepts",
                    node.start_mark) from None

    # the implicit resolvers are class-level lists per first character: copy them, numbers without base 60
    Loader.yaml_implicit_resolvers = {
        ch: [(tag, rx) for tag, rx in resolvers if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
        for ch, resolvers in base.yaml_implicit_resolvers.items()}
    Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_yaml_int)
    for tag, pattern in (("tag:yaml.org,2002:int", _INT), ("tag:yaml.org,2002:float", _FLOAT)):
        Loader.add_implicit_resolver(tag, re.compile(pattern, re.X), list("-+0123456789."))
    _LOADERS["safe"] = Loader
    return Loader


# PyYAML's YAML 1.1 int and float patterns without their base-60 branch (``190:20:30``)
_INT = r"""^(?:[-+]?0b[0-1_]+
    |[-+]?0[0-7_]+
    |[-+]?(?:0|[1-9][0-9_]*)
    |[-+]?0x[0-9a-fA-F_]+)$"""
_FLOAT = r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
    |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$"""


def parse_json(text: str, source: str) -> Any:
    """Parse JSON ``text`` from ``source``: never evaluated; NaN and Infinity refused; at most
    :data:`MAX_JSON_VALUES` values (counted first) nested at most :data:`MAX_NESTING` deep; a key twice in one
    object refused with the key and the line of its object."""
    values = text.count(",") + text.count("[") + text.count("{") + 1  # an upper bound on the values in the text
    if values > MAX_JSON_VALUES:
        raise InputError(source, "", f"about {values:,} JSON values; ampe reads at most {MAX_JSON_VALUES:,} from one "
                         "file")
    try:
        doc = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_unique_pairs)
    except RecursionError:
        raise InputError(source, "", f"nested deeper than {MAX_NESTING} levels") from None
    except _DuplicateKeyError as e:
        where = _object_line(text, e.key) if "\n" in text.strip() else ""  # a JSONL line: its source names the line
        raise InputError(source, where, f"key {e.key!r} appears twice in one object; ampe does not pick one") from None
    except ValueError as e:
        if isinstance(e, json.JSONDecodeError):
            raise InputError(source, f"line {e.lineno}", f"JSON syntax error: {e.msg}") from None
        long = _LONG_INT.search(text)
        if long is not None:  # Python's limit on digits in int(): no ampe number is anywhere near it
            raise InputError(source, f"line {text.count(chr(10), 0, long.start()) + 1}", "an integer of more than "
                             "4,000 digits; not a number ampe accepts") from None
        raise InputError(source, _constant_field(text), str(e)) from None
    check_depth(doc, source)
    return doc


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKeyError(key, 0, 0)
            seen.add(key)
    return out


def _object_line(text: str, key: str) -> str:
    """Where the first object holding ``key`` twice starts, found again by Python's own JSON scanner (slow, so only
    on this error path; the text parsed once already, so it is bounded)."""
    from json import decoder, scanner

    found: list[int] = []

    def parse_object(s_and_end: tuple[str, int], *args: Any) -> tuple[Any, int]:
        start = s_and_end[1]
        obj, end = decoder.JSONObject(s_and_end, *args)  # type: ignore[attr-defined]
        if not found and isinstance(obj, list) and [k for k, _ in obj].count(key) > 1:
            found.append(start)
        return dict(obj) if isinstance(obj, list) else obj, end

    dec = json.JSONDecoder(object_pairs_hook=list)
    dec.parse_object = parse_object  # type: ignore[attr-defined]
    dec.scan_once = scanner.py_make_scanner(dec)  # type: ignore[attr-defined]
    with contextlib.suppress(ValueError, RecursionError):
        dec.decode(text)
    return f"line {text.count(chr(10), 0, found[0]) + 1}" if found else key


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number ampe accepts (JSON has no NaN or Infinity)")


_LONG_INT = re.compile(r"\d{4000}")
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


_CONTAINERS = (dict, list)


def check_depth(doc: Any, source: str) -> None:
    """Refuse ``doc`` when it nests deeper than MAX_NESTING. Level by level, keeping only the containers of each
    level, picked at C speed (``compress`` over ``isinstance``): a 31-million-number array takes about a second,
    not 8.5 s as one tuple per value did."""
    import itertools

    level = [doc] if isinstance(doc, _CONTAINERS) else []
    depth = 0  # of the containers in ``level``; their values are one deeper
    while level:
        below: list[Any] = []
        for node in level:
            if depth >= MAX_NESTING and node:  # a value, of any kind, deeper than the limit
                raise InputError(source, "", f"nested deeper than {MAX_NESTING} levels")
            values = node.values() if isinstance(node, dict) else node
            below.extend(itertools.compress(values, map(isinstance, values, itertools.repeat(_CONTAINERS))))
        level = below
        depth += 1


MAX_INDEX_DIGITS = 9  # ids and indices (devices, ranks, layers) are below a billion; Python refuses int() past 4,300


def parse_index(text: str) -> int | None:
    """``text`` as a non-negative index if it is 1..MAX_INDEX_DIGITS ASCII digits (``17``, ``007``), else None: the one
    reader of ids and indices typed in references (``--without 17``, ``p3-1:2``, ``down:``, ``stragglers:``).
    ``str.isdigit`` also takes ``²`` and ``٣``, which ``int`` then refuses or reads otherwise."""
    if not 0 < len(text) <= MAX_INDEX_DIGITS or not text.isascii() or not text.isdigit():
        return None
    return int(text)
