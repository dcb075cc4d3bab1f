"""Identical layers measured once: which layers repeat an earlier one, and their rows as repeats of its rows.

Two layers are identical when their specs are equal but for the name (``Layer`` without ``name``): the trial worker
builds the same module for both (Llama's and GPT's transformer blocks, the GPT layout's noops), and a standalone
layer's time does not depend on its place in the model. On one H200 the 16 measured blocks of Llama-3.2-1B at seq
4096 summed to within −4.0 to +2.1 % of 16 × the first block's figures, per attention kernel, recomputation and
micro-batch size (tests/data/h200/gpu_check/profile_s4096.csv; docs/gpu_check.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ampe.costmodel.model import Model
from ampe.formats.profile import ProfileRow


def identical_layers(model: Model) -> dict[int, int]:
    """Each layer identical to an earlier one, mapped to the first such layer (the one measured).

    Args:
        model: the model profiled.

    Returns:
        ``{layer: first identical layer}`` for every layer but the first of its kind of spec."""
    first: dict[object, int] = {}
    same: dict[int, int] = {}
    for i, layer in enumerate(model.layers):
        spec = dataclasses.replace(layer, name="")
        if spec in first:
            same[i] = first[spec]
        else:
            first[spec] = i
    return same


def repeat_rows(rows: Sequence[ProfileRow], same: dict[int, int]) -> list[ProfileRow]:
    """``rows`` with, for each layer of ``same``, copies of its measured layer's rows (``same_as_layer`` set), in
    the profiler's order (tp, mbs, layer; each layer's rows in their measured order).

    Args:
        rows: measured rows (no row for a layer of ``same``).
        same: :func:`identical_layers`' map.

    Returns:
        Every layer's rows."""
    if not same:
        return list(rows)
    by_layer: dict[int, list[int]] = {}
    for target, source in same.items():
        by_layer.setdefault(source, []).append(target)
    out = list(rows)
    for r in rows:
        out += [r.model_copy(update={"layer": j, "same_as_layer": r.layer}) for j in by_layer.get(r.layer, ())]
    return sorted(out, key=lambda r: (r.sm_clock_mhz or 0, r.tp, r.mbs, r.layer))
