"""The layer-assignment DP's memory constraint of a strategy: the allocated peak the estimate computes
(:func:`~ampe.costmodel.memory.stage_memory`) for every segment of layers a stage could hold, as
:class:`~ampe.costmodel.bounds.MemoryBound` s built from the same terms (:mod:`ampe.costmodel.memory`).

For device stage j on a GPU of type t holding layers a..b-1 (S, A, P: prefix sums of the states, kept activations
and trainable parameters per layer; k micro-batches in flight; in(a), out(b): the pipe buffers of the cuts before
and after; T: the last stage's kept logits and loss working set, at b = L only; w: the largest backward working set
of its layers, less the loss's on the last stage; G = P · gradient bytes; room = the allocatable bytes of type t
less its workspaces)::

    stage_memory(...).allocated − workspace = max(training, optimizer step, all-reduce) + w,    each ≤ room

    training     = S + k·A + in(a) + out(b) + T(b)         k < gas, or interleaved (k/v chunk micro-batches)
                 = max(S − G + k·A + … ,  S + (k−1)·A + … (+ w only if k > 1))      k ≥ gas (gas = 1, GPipe)
    step, reduce = optimizer_step_peaks(P, S, T(b))       affine: the prefix, the end, a constant

Every operand is a sum over the layers, a term of the first layer, a term of the end and (with w) a largest
over the layers: one MemoryBound each (the last stage folds the loss into w: T − loss + max(w, loss) is what
``stage_memory`` adds there), so the DP's mask is the estimate's ``allocated ≤ allocatable`` for that segment, up
to floating-point rounding. A stage with several GPU types meets every type's bounds. Conservative, each by a
stated amount:

* a tied weight counted on every layer holding it: over by that weight's states where one segment holds two
  members of its group (GPT's embedding and LM head: a stage of all layers but the last no-op at most, a partition
  that is never fast);
* gas = 1 (k = 1 ≥ gas) where the optimizer step or all-reduce exceeds the training peak and the stage's
  gradients exceed its activations plus working set: over by at most the working set w (``stage_memory`` then
  adds none);
* interleaved chunks: each chunk within room / v (the device's sum of them within room), and the step's constant
  (ZeRO's buckets) charged per chunk: ``combine_chunks`` counts a device's step peak, working set and logits once.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ampe.costmodel.bounds import MemoryBound, fitting_partition, partition_meets
from ampe.costmodel.caches import degrees_key
from ampe.costmodel.final_output import final_output_bytes, loss_bytes
from ampe.costmodel.memory import (
    allocatable_bytes,
    grad_bytes_per_param,
    in_flight,
    input_buffer_bytes,
    optimizer_step_peaks,
    output_buffer_bytes,
    output_slots,
    pipe_buffer_slots,
    recompute_working_bytes,
)
from ampe.costmodel.strategy import Strategy

if TYPE_CHECKING:
    from ampe.costmodel.estimate import CostModel


class _Rows(NamedTuple):
    """One bound's arrays on every device stage (pp rows), as :class:`MemoryBound` takes them, its capacity the
    room."""

    head: np.ndarray  # (F, pp, L+1) bytes of each operand by the first layer
    tail: np.ndarray  # (F, pp, L+1) bytes of each operand by the end
    peak: np.ndarray | None  # (pp, L) bytes


def memory_bounds(cm: CostModel, s: Strategy, stage_types: tuple[tuple[int, ...], ...],
                  margin: bool = False) -> tuple[MemoryBound, ...]:
    """The DP's memory bounds of ``s`` (degrees, memory options, schedule) per pipeline position (n_pos rows): a
    segment fits a position when it meets every bound (module docstring): its devices' footprints within their
    capacity, with ``margin`` leaving their reserve free too (``allocatable_bytes``: the strategies that *fit*, not
    at risk). Depends on the GPU types on each stage (``stage_types``), and only on their memory
    (:func:`_memory_types`), not on which devices they are; kept for a few calls (the memory check and the stage
    tables of one candidate ask for the same); read-only."""
    types = _memory_types(cm, s, stage_types, margin)
    return cm.caches.recent(("memory_bounds", degrees_key(s), types, margin),
                            lambda: _make_bounds(cm, s, types, margin))


def memory_may_fit(cm: CostModel, s: Strategy, recompute_options: tuple[str, ...] = (), margin: bool = False) -> bool:
    """False only when no partition of ``s`` (degrees, memory options, placement) meets the memory bounds of its
    stage tables (``margin`` as :func:`memory_bounds`'), i.e. when the layer-assignment DP on
    :func:`~ampe.costmodel.tables.stage_tables` is certain to find no partition; True otherwise. With
    ``recompute_options``, each stage may run any one of them (the DP's per-stage options): False only when no
    partition fits with every stage under one of them. The same bounds and comparisons as the DP's mask
    (:func:`~ampe.costmodel.bounds.fitting_partition`), so the answer is exact, mostly at O(options · positions · L)
    instead of the tables and the DP; the last partition found to fit for these degrees is tried first (one vector
    check). Cached per (degrees and options, the memory of the GPU types on each stage,
    margin): placements that put types of the same memory on the same stages share it (the search tries it before
    each memory option)."""
    assert s.placement is not None
    stage_types = cm.stage_types(s)
    variants = [replace(s, recompute=r, stage_recompute=None) for r in recompute_options or (s.recompute,)]
    types = tuple(_memory_types(cm, v, stage_types, margin) for v in variants)

    def decide() -> bool:
        # a partition that fitted another placement of these degrees (with or without margin) often fits this one:
        # checked first, at once
        witnesses: dict[tuple, tuple[int, ...]] = cm.caches.cached(("memory_witnesses",), dict)
        key = (degrees_key(s), recompute_options)
        options = [memory_bounds(cm, v, stage_types, margin) for v in variants]
        if key in witnesses and partition_meets(witnesses[key], *options):
            return True
        found = fitting_partition(*options)
        if found is not None:
            witnesses[key] = found
        return found is not None

    return bool(cm.caches.cached(("may_fit", degrees_key(s), recompute_options, types, margin), decide))


def _memory_types(cm: CostModel, s: Strategy, stage_types: tuple[tuple[int, ...], ...],
                  margin: bool) -> tuple[tuple[int, ...], ...]:
    """``stage_types`` with each GPU type replaced by the first type whose memory operands and room under ``s`` (its
    stage's recomputation) are the same to the last bit (H100-80GB and A100-80GB without a profile, say): the bounds
    of both are the same, so placements that differ only between such types share them."""
    if s.stage_recompute is None:
        same = _same_memory(cm, s, s.recompute, margin)
        if same == tuple(range(len(same))):  # every type its own: nothing to replace
            return stage_types
        return tuple(tuple(sorted({same[t] for t in ts})) for ts in stage_types)
    sames = {rec: _same_memory(cm, s, rec, margin) for rec in set(s.stage_recompute)}
    return tuple(tuple(sorted({sames[rec][t] for t in ts})) for ts, rec in zip(stage_types, s.stage_recompute,
                                                                                strict=True))


def _same_memory(cm: CostModel, s: Strategy, rec: str, margin: bool) -> tuple[int, ...]:
    """Per GPU type, the first type with the same operands (:func:`_type_rows`) and room under ``s`` and ``rec``
    (cached per degrees, recomputation and margin)."""

    def make() -> tuple[int, ...]:
        gpus = cm.device_types().gpus
        firsts: list[int] = []
        out = []
        for t, gpu in enumerate(gpus):
            room = allocatable_bytes(gpu, s.expandable_segments, margin) - gpu.workspace_bytes
            mine = _type_rows(cm, s, t, rec)
            for u in firsts:
                theirs = _type_rows(cm, s, u, rec)
                if room == allocatable_bytes(gpus[u], s.expandable_segments, margin) - gpus[u].workspace_bytes \
                        and all(_equal(x, y) for a, b in zip(mine, theirs, strict=True)
                                for x, y in zip(a, b, strict=True)):
                    out.append(u)
                    break
            else:
                firsts.append(t)
                out.append(t)
        return tuple(out)

    return cm.caches.cached(("same_memory", s.tp, s.zero, s.dp, s.schedule, s.pp, s.gas, s.mbs, s.virtual_stages, rec,
                             margin, s.expandable_segments), make)


def _equal(x: np.ndarray | None, y: np.ndarray | None) -> bool:
    """Whether two operand arrays (or Nones) are the same to the last bit."""
    return x is y or (x is not None and y is not None and np.array_equal(x, y))


def _make_bounds(cm: CostModel, s: Strategy, stage_types: tuple[tuple[int, ...], ...],
                 margin: bool) -> tuple[MemoryBound, ...]:
    """:func:`memory_bounds`, computed: each stage's rows from its (GPU type, recomputation) tables, one set of
    bounds per type slot (a stage with fewer types repeats its last), the capacities from each type's room. The
    bounds of a set share their working-set array (one object: what reads them may compute its maxima once)."""
    recs = [s.recompute_at(j) for j in range(s.pp)]
    stage_of = np.arange(s.pp * s.virtual_stages) % s.pp  # position → device stage
    gpus = cm.device_types().gpus
    out = []
    for slot in range(max(len(ts) for ts in stage_types)):
        types = [ts[min(slot, len(ts) - 1)] for ts in stage_types]
        keys = list(zip(types, recs, strict=True))
        distinct = list(dict.fromkeys(keys))
        tables = [_type_rows(cm, s, t, rec) for t, rec in distinct]
        table_of = np.array([distinct.index(k) for k in keys])[stage_of]  # position → its stage's table
        # the largest allocated peak beyond the workspaces each stage's type allows, a chunk's share of it
        room = np.array([allocatable_bytes(gpus[t], s.expandable_segments, margin) - gpus[t].workspace_bytes
                         for t in types]) / s.virtual_stages
        out += _slot_bounds(tables, table_of, stage_of, room)
    return tuple(out)


def _slot_bounds(tables: list[list[_Rows]], table_of: np.ndarray, stage_of: np.ndarray,
                 room: np.ndarray) -> list[MemoryBound]:
    """One type slot's bounds: position p's rows from ``tables[table_of[p]]`` at device stage ``stage_of[p]``, the
    capacity the stage's ``room``."""
    picked: dict[tuple[int, ...], np.ndarray] = {}
    capacity = room[stage_of]
    capacity.setflags(write=False)

    def pick(f: int, i: int) -> np.ndarray | None:
        if tables[0][f][i] is None:
            return None
        sources = [np.asarray(table[f][i]) for table in tables]  # (the cached arrays themselves)
        key = tuple(map(id, sources))
        if key not in picked:
            rows = sources[0].ndim - 2  # the axis of the device stages: 1 for operands, 0 for the peak
            if len(sources) > 1:
                whole = np.moveaxis(np.moveaxis(np.stack(sources), rows + 1, 1)[table_of, stage_of], 0, rows)
            elif len(stage_of) == sources[0].shape[rows]:  # one table, one position per stage: its rows as they are
                whole = sources[0]
            else:
                whole = np.take(sources[0], stage_of, axis=rows)
            whole.setflags(write=False)
            picked[key] = whole
        return picked[key]

    out = []
    for f in range(len(tables[0])):
        head, tail, peak = (pick(f, i) for i in range(3))
        assert head is not None and tail is not None
        out.append(MemoryBound(head, tail, capacity, peak))
    return out


def _type_rows(cm: CostModel, s: Strategy, t: int, rec: str) -> list[_Rows]:
    """The bounds (module docstring) on every device stage of ``s``'s schedule for GPU type ``t`` under
    recomputation ``rec``, their capacity the room: one with the working set whose operands are, in order,
    training, [fewer in flight: gas > 1 and a stage with k ≥ gas], optimizer step, [all-reduce]; at gas = 1 one
    more of the fewer in flight alone, without it. Cached per (degrees, type, recomputation)."""
    key = ("memory_operands", s.tp, s.zero, s.dp, s.schedule, s.pp, s.gas, s.mbs, s.virtual_stages, t, rec)
    return cm.caches.cached(key, lambda: _make_type_rows(cm, s, t, rec))


def _make_type_rows(cm: CostModel, s: Strategy, t: int, rec: str) -> list[_Rows]:
    """:func:`_type_rows`, computed."""
    model = cm.model
    L, v = model.num_layers, s.virtual_stages
    gpu = cm.device_types().gpus[t]
    interleaved = s.schedule == "interleaved" and v > 1
    k, cut_in, cut_out, final = cm.caches.cached(("memory_cuts", s.schedule, s.pp, s.gas, s.mbs, v, s.tp),
                                                 lambda: _cut_rows(cm, s))
    states = _prefix(cm.layer_states(s.tp, s.zero, s.dp))
    params = cm.caches.cached(("trainable_prefix", s.tp), lambda: _prefix(np.array(
        [layer.trainable_params_per_rank(s.tp) for layer in model.layers])))
    acts = _prefix(cm.layer_activations(gpu, s.tp, s.mbs, rec))
    loss = loss_bytes(model, s.mbs, s.tp)
    mask = gpu.mask_bytes(model.bytes_per_elem)
    work = cm.caches.cached(("working_sets", s.tp, s.mbs, mask, rec), lambda: np.array(
        [recompute_working_bytes(model, range(i, i + 1), s.tp, s.mbs, mask, rec)
         for i in range(L)]))
    peak = np.tile(work, (s.pp, 1))
    peak[:, -1] = np.maximum(peak[:, -1], loss)  # T − loss + max(w, loss) = T + max(0, w − loss)
    at_end = np.zeros((s.pp, L + 1))
    at_end[:, -1] = final
    coef = np.where(interleaved, k / v, k)[:, None]
    all_in = (k >= s.gas) & (not interleaved)  # every micro-batch in flight: gradients not yet there at the peak
    grads = params * grad_bytes_per_param(model.dtype)
    def operand(prefix: np.ndarray, start: np.ndarray | None, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """An operand's sum over layers, first-layer and end terms as a head and a tail (bounds.MemoryBound.of)."""
        return -prefix + (0.0 if start is None else start), prefix + end

    training = states[None, :] + coef * acts[None, :] - np.where(all_in, 1.0, 0.0)[:, None] * grads[None, :]
    operands = [operand(training, cut_in, cut_out + at_end - loss * (at_end > 0))]
    apart: list[tuple[np.ndarray, np.ndarray]] = []  # operands without the working set: a bound of their own
    if all_in.any():
        later = s.gas > 1  # k − 1 ≥ 1 micro-batches' backwards still run once the gradients exist
        head, tail = operand(states[None, :] + (k - 1)[:, None] * acts[None, :], cut_in,
                             cut_out + at_end - (loss * (at_end > 0) if later else 0.0))
        if later:  # (stages with k < gas: the training operand again, which it never exceeds)
            head, tail = (np.where(all_in[:, None], x, y) for x, y in zip((head, tail), operands[0], strict=True))
        (operands if later else apart).append((head, tail))
    zero_step = optimizer_step_peaks(model, s.mbs, s.zero, s.dp, 0.0, 0.0, 0.0, s.tp)
    along = optimizer_step_peaks(model, s.mbs, s.zero, s.dp, params, states, 0.0, s.tp)
    ends = [optimizer_step_peaks(model, s.mbs, s.zero, s.dp, 0.0, 0.0, float(f), s.tp) for f in final]
    for i, (c0, row) in enumerate(zip(zero_step, along, strict=True)):
        # the step's constant (ZeRO's buckets) in the tail: its sum within the room
        end = np.full((s.pp, L + 1), c0)
        end[:, -1] = [e[i] - loss for e in ends]
        operands.append(operand(np.tile(np.asarray(row) - c0, (s.pp, 1)), None, end))
    out = [_Rows(np.stack([h for h, _ in group]), np.stack([t for _, t in group]), top)
           for group, top in ((operands, peak), (apart, None)) if group]
    for bound in out:  # (kept: read-only)
        for arr in bound:
            if arr is not None:
                arr.setflags(write=False)
    return out


def _cut_rows(cm: CostModel, s: Strategy) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per device stage of ``s``'s schedule: micro-batches in flight (pp,), the pipe buffers of the cut before a
    first layer a at [j, a] and after an end b at [j, b] (pp, L+1), and the last stage's final output with the
    loss working set, were it to end there (pp,)."""
    model = cm.model
    L = model.num_layers
    k = np.array([in_flight(s.schedule, j, s.pp, s.gas, s.virtual_stages) for j in range(s.pp)], dtype=np.int64)
    slots = [pipe_buffer_slots(j, s.pp, s.gas) for j in range(s.pp)]

    def before(n: int, kj: int) -> np.ndarray:
        return cm.caches.cached(("input_buffers", s.mbs, n, kj), lambda: np.array(
            [input_buffer_bytes(model, a, s.mbs, n, kj) for a in range(L)] + [0.0]))

    def after(n: int) -> np.ndarray:
        return cm.caches.cached(("output_buffers", s.mbs, n), lambda: np.array(
            [0.0] + [output_buffer_bytes(model, b - 1, s.mbs, n) for b in range(1, L + 1)]))

    cut_in = np.stack([before(n, int(kj)) for n, kj in zip(slots, k, strict=True)])
    cut_out = np.stack([after(n) for n in slots])
    final = np.array([final_output_bytes(model, s.mbs, output_slots(j, s.pp, s.gas), s.tp)
                      for j in range(s.pp)])
    return k, cut_in, cut_out, final


def _prefix(per_layer: np.ndarray) -> np.ndarray:
    """(L+1,) prefix sums of (L,) per-layer values."""
    out = np.zeros(len(per_layer) + 1)
    out[1:] = np.cumsum(per_layer)
    return out
