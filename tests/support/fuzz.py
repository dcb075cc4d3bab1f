"""Mutating JSON-like documents for fuzz tests: replace, delete or add a value at random places."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st


def paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key/index path inside ``obj`` (the root excluded)."""
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += paths(v, (*prefix, i))
    return out


@st.composite
def mutated(draw: Any, base: Any, junk: Any, max_edits: int = 3) -> Any:
    """A copy of ``base`` with 1..max_edits values replaced by ``junk``, deleted, or junk added beside them."""
    doc = copy.deepcopy(base)
    places = paths(base)
    for _ in range(draw(st.integers(1, max_edits))):
        path = draw(st.sampled_from(places))
        target = doc
        try:
            for part in path[:-1]:
                target = target[part]
            action = draw(st.sampled_from(["replace", "delete", "add"]))
            if action == "replace":
                target[path[-1]] = draw(junk)
            elif action == "delete":
                del target[path[-1]]
            elif isinstance(target, dict):
                target[draw(st.text(max_size=6))] = draw(junk)
            else:
                target.append(draw(junk))
        except (KeyError, IndexError, TypeError, AttributeError):
            pass
    return doc
