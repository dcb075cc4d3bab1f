"""The computation DAG of one training iteration of one pipeline schedule (activity on node), built from the
schedule orders of :mod:`ampe.costmodel.schedules` as a :class:`~ampe.tradeoff.dag.ComputationDag`.

Nodes are forward/backward computations F(v, m), B(v, m) of micro-batch m on virtual stage v (= chunk · N + stage)
and pipeline transfers. Edges (Perseus §2, lowtime ``forward_dep``/``backward_dep``):

* F(v, m) → [transfer] → F(v+1, m)  (activation),
* B(v+1, m) → [transfer] → B(v, m)  (gradient),
* F(V−1, m) → B(V−1, m)  (loss),
* consecutive computations of the same stage in schedule order.

Every node carries an :class:`~ampe.tradeoff.options.OpOptions`; transfers and any computation with one option are
constant-time. Nodes are stored in topological order so that ``preds[v] < v``.
"""

from __future__ import annotations

import graphlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from ampe.costmodel.schedules import BACKWARD, FORWARD, stage_orders
from ampe.tradeoff.dag import TRANSFER, ComputationDag, Node
from ampe.tradeoff.levels import Levels
from ampe.tradeoff.options import OpOptions, constant


def build_dag(stage_specs: Sequence[Mapping[str, OpOptions]], num_microbatches: int, *, schedule: str = "1f1b",
              blocking_w: Sequence[float], p2p_forward_s: Sequence[float] | None = None,
              p2p_backward_s: Sequence[float] | None = None, virtual_stages: int = 1) -> ComputationDag:
    """Build the DAG of ``schedule`` for ``num_microbatches`` micro-batches.

    ``stage_specs[v]`` maps "forward"/"backward" to the options of virtual stage v (= chunk · N + device stage;
    with ``virtual_stages`` = 1 simply stage v); ``p2p_*_s[b]`` is the transfer time (s) across virtual boundary b
    (v = b → b+1 for activations, b+1 → b for gradients; with interleaving the hop from the last device back to the
    first for the next chunk is a boundary too); zero or missing means no transfer node. ``blocking_w[s]`` is
    device stage s's waiting power (W).
    """
    num_virtual = len(stage_specs)
    if virtual_stages < 1 or num_virtual % virtual_stages:
        raise ValueError("stage_specs needs num_stages × virtual_stages entries")
    n = num_virtual // virtual_stages
    if len(blocking_w) != n:
        raise ValueError("blocking_w needs one value per stage")
    pf = list(p2p_forward_s or [0.0] * (num_virtual - 1))
    pb = list(p2p_backward_s if p2p_backward_s is not None else pf)
    if len(pf) != num_virtual - 1 or len(pb) != num_virtual - 1:
        raise ValueError("p2p times need one value per (virtual) stage boundary")
    first = 2 * num_virtual
    links, transfer_s = _transfer_specs(pf, pb, n, first)
    shape = _shape(schedule, n, num_microbatches, virtual_stages, tuple(x >= 0 for x in links))
    specs = [kinds[kind] for kinds in stage_specs for kind in (FORWARD, BACKWARD)]
    specs.extend(constant(seconds) for seconds in transfer_s)
    nodes, derived = shape.nodes, shape.derived
    # the shape's spec index (for a transfer: first + its slot) → this DAG's
    spec_of = np.concatenate([np.arange(first), np.asarray(links, dtype=np.int64)])
    if not np.array_equal(spec_of, np.arange(len(spec_of))):  # transfers share specs: renumber them
        hit = shape.renumbered.get(links)
        if hit is None:
            where = shape.transfers.tolist()
            ids = spec_of[derived["spec_of"][shape.transfers]].tolist()
            renamed = list(nodes)
            for v, spec in zip(where, ids, strict=True):
                x = renamed[v]
                renamed[v] = Node(TRANSFER, x.stage, x.microbatch, x.chunk, spec)
            node_specs = spec_of[derived["spec_of"]]
            node_specs.flags.writeable = False
            if len(shape.renumbered) >= _RENUMBERED:
                shape.renumbered.clear()
            hit = shape.renumbered[links] = (tuple(renamed), node_specs)
        nodes = hit[0]
        derived = {**derived, "spec_of": hit[1]}
    dag = ComputationDag(nodes=nodes, preds=shape.preds, specs=tuple(specs),
                         blocking_w=tuple(float(w) for w in blocking_w), stage_order=shape.stage_order,
                         num_microbatches=num_microbatches, schedule=schedule)
    dag.__dict__.update(derived)  # the cached properties that depend on the shape alone
    return dag


def _transfer_specs(pf: Sequence[float], pb: Sequence[float], n: int, first: int
                    ) -> tuple[tuple[int, ...], list[float]]:
    """Per virtual boundary b the spec index of its activation transfer, then of its gradient transfer (-1: no
    transfer node), and the seconds of each transfer spec in index order (from ``first``): one spec per distinct
    (seconds, sender), numbered in order of first use, as :func:`build_dag` has always numbered them."""
    ids: dict[tuple[float, int], int] = {}
    seconds: list[float] = []
    out = []
    for b in range(len(pf)):
        for t, sender in ((pf[b], b % n), (pb[b], (b + 1) % n)):
            if t > 0:
                spec = ids.get((t, sender))
                if spec is None:
                    spec = ids[(t, sender)] = first + len(seconds)
                    seconds.append(t)
                out.append(spec)
            else:
                out.append(-1)
    return tuple(out), seconds


@dataclass(frozen=True, eq=False)
class _Shape:
    """What a DAG's structure alone fixes: nodes, predecessors, every stage's execution order and the cached
    properties that follow from them (shared, read-only, by every DAG of this shape). A transfer node's spec index
    here is 2 · num_virtual + its link's slot (2 · boundary, + 1 for the gradient);
    :func:`build_dag` renumbers them where transfers share specs."""

    nodes: tuple[Node, ...]
    preds: tuple[tuple[int, ...], ...]
    stage_order: tuple[tuple[int, ...], ...]
    derived: dict
    transfers: np.ndarray  # the transfer nodes
    renumbered: dict = field(default_factory=dict)  # links → (nodes, spec per node) where transfers share specs


@lru_cache(maxsize=32)
def _shape(schedule: str, n: int, num_microbatches: int, virtual_stages: int, links: tuple[bool, ...]) -> _Shape:
    """The shape of :func:`build_dag`'s DAG; ``links``: per slot (as :func:`_transfer_specs` orders them) whether
    there is a transfer node (replicas and strategies of one pipeline shape share it; only the option sets
    differ)."""
    orders = stage_orders(schedule, n, num_microbatches, virtual_stages)
    num_virtual = n * virtual_stages
    nodes: list[Node] = []
    edges: list[tuple[int, int]] = []
    where: dict[tuple[str, int, int], int] = {}  # (kind, virtual stage, micro-batch) → node
    for s, order in enumerate(orders):
        prev = -1
        for st in order:
            v = len(nodes)
            vs = st.chunk * n + s
            nodes.append(Node(st.instruction, s, st.microbatch, st.chunk, 2 * vs + (st.instruction == BACKWARD)))
            where[(st.instruction, vs, st.microbatch)] = v
            if prev >= 0:
                edges.append((prev, v))
            prev = v

    def link(a: int, b: int, slot: int, sender: int, mb: int) -> None:
        if links[slot]:
            t = len(nodes)
            nodes.append(Node(TRANSFER, sender, mb, spec=2 * num_virtual + slot))
            edges.extend(((a, t), (t, b)))
        else:
            edges.append((a, b))

    for mb in range(num_microbatches):
        for v in range(num_virtual - 1):
            link(where[(FORWARD, v, mb)], where[(FORWARD, v + 1, mb)], 2 * v, v % n, mb)
            link(where[(BACKWARD, v + 1, mb)], where[(BACKWARD, v, mb)], 2 * v + 1, (v + 1) % n, mb)
        edges.append((where[(FORWARD, num_virtual - 1, mb)], where[(BACKWARD, num_virtual - 1, mb)]))
    return _toposorted(nodes, edges, orders, schedule)


def _toposorted(nodes: list[Node], edges: list[tuple[int, int]], orders: list, schedule: str) -> _Shape:
    preds: list[set[int]] = [set() for _ in nodes]
    for a, b in edges:
        preds[b].add(a)
    topo = _static_order(preds)
    if len(topo) < len(nodes):  # a schedule that deadlocks: graphlib names the cycle
        try:
            list(graphlib.TopologicalSorter({v: preds[v] for v in range(len(nodes))}).static_order())
        except graphlib.CycleError as e:
            raise ValueError(f"schedule {schedule!r} has a dependency cycle: {e.args[1]}") from None
    new = [0] * len(nodes)  # old id → topological id
    for i, old in enumerate(topo):
        new[old] = i
    stage_order: list[list[int]] = [[] for _ in orders]
    for v in range(len(nodes)):  # creation order is each stage's execution order
        if nodes[v].kind != TRANSFER:
            stage_order[nodes[v].stage].append(new[v])
    shape = _Shape(tuple(nodes[v] for v in topo), tuple(tuple(sorted([new[p] for p in preds[v]])) for v in topo),
                   tuple(tuple(o) for o in stage_order), {},
                   np.flatnonzero([nodes[v].kind == TRANSFER for v in topo]))
    probe = ComputationDag(shape.nodes, shape.preds, (), (), shape.stage_order, 0, schedule)
    for name in _SHAPE_PROPERTIES:
        value = getattr(probe, name)
        if isinstance(value, Levels):  # shared by every DAG of the shape
            value.freeze()
        elif isinstance(value, np.ndarray):
            value.flags.writeable = False
        shape.derived[name] = value
    return shape


_RENUMBERED = 16  # most transfer-sharing patterns kept per shape
_SHAPE_PROPERTIES = ("succs", "levels", "computation_mask", "node_stage", "spec_of")


def _static_order(preds: list[set[int]]) -> list[int]:
    """The order ``graphlib.TopologicalSorter({v: preds[v] ...}).static_order()`` gives (the node numbering, and so
    every plan, depends on it), without graphlib's per-node objects and cycle search; shorter than the nodes when
    there is a cycle."""
    n = len(preds)
    succs: list[list[int]] = [[] for _ in range(n)]
    seen = [False] * n
    created = []  # the order graphlib creates its node records in: a node, then its predecessors
    for v in range(n):
        if not seen[v]:
            seen[v] = True
            created.append(v)
        for p in preds[v]:
            if not seen[p]:
                seen[p] = True
                created.append(p)
            succs[p].append(v)
    waiting = [len(p) for p in preds]
    ready = [v for v in created if waiting[v] == 0]
    out: list[int] = []
    while ready:
        group, ready = ready, []
        out.extend(group)
        for u in group:
            for w in succs[u]:
                waiting[w] -= 1
                if waiting[w] == 0:
                    ready.append(w)
    return out
