"""Device index maps of one candidate as arrays: which device, GPU type and link each (stage, replica, shard) of a
placement has, computed once per (degrees, placement) and shared by the stage tables and every estimate of it.

Everything here is the same as the per-device definitions it replaces (``Strategy.device``, the slowest GPU type
by ``CostModel.slowness``, :func:`~ampe.costmodel.comm.ring_bandwidth`, the slowest shard-to-shard link of a
boundary): the same minima over the same bandwidth entries, taken with numpy over whole axes instead of one ring at
a time (exact: a minimum does not round). At 4,096 GPUs that is a few
array operations per candidate instead of hundreds of thousands of Python calls.

Links that carry several flows at once are shared (:meth:`~ampe.costmodel.links.LinkBandwidth.concurrent`): the
flows of one pipeline boundary (every replica's every shard, in lockstep) share the network interfaces they cross,
and so do the hops of every data-parallel ring (every stage's every shard: the tail starts them together after the
pipeline drains). ``next_link`` and ``dp_ring`` hold what each flow gets so; a tensor-parallel ring's hops are not
shared (its group's all-reduces are inside the layer times).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from ampe.costmodel.catalog import GpuType
from ampe.costmodel.cluster import Cluster
from ampe.costmodel.links import LinkBandwidth


@dataclass(frozen=True, eq=False)
class DeviceTypes:
    """The cluster's GPU types as indices: what the per-candidate arrays refer to."""

    gpus: tuple[GpuType, ...]  # indexed by type index, in order of first appearance
    of_device: np.ndarray  # (n,) type index of each device
    pace_rank: np.ndarray  # (T,) rank of each type by (slowness, name): the highest rank in a group sets its pace
    memory_bytes: np.ndarray  # (T,) capacity of each type, bytes

    @classmethod
    def of(cls, cluster: Cluster, slowness: dict[str, float]) -> DeviceTypes:
        """Index ``cluster``'s types; ``slowness`` (name → seconds, ``CostModel.slowness``) orders them (ties: by
        name)."""
        gpus = cluster.gpu_types()
        index = {g.name: i for i, g in enumerate(gpus)}
        of_device = np.fromiter((index[d.gpu.name] for d in cluster.devices), dtype=np.int64, count=cluster.size)
        order = sorted(range(len(gpus)), key=lambda i: (slowness[gpus[i].name], gpus[i].name))
        rank = np.empty(len(gpus), dtype=np.int64)
        rank[order] = np.arange(len(gpus))
        memory = np.array([g.memory_bytes for g in gpus], dtype=np.int64)
        return cls(gpus, of_device, rank, memory)


@dataclass(frozen=True, eq=False)
class DeviceLayout:
    """Per-candidate device maps (rank = j·dp·tp + r·tp + k, as :class:`~ampe.costmodel.strategy.Strategy`).

    Bandwidths in bytes/s, ``inf`` for a ring of one member (as ``ring_bandwidth``)."""

    grid: np.ndarray  # (pp, dp, tp) device id of (stage, replica, shard)
    types: np.ndarray  # (pp, dp, tp) type index of each device
    pace: np.ndarray  # (pp, dp) type index of the slowest GPU of each tensor-parallel group
    tp_ring: np.ndarray  # (pp, dp) slowest hop of each tensor-parallel group's ring
    dp_ring: np.ndarray  # (pp, tp) slowest hop of each data-parallel ring (shard k of every replica, in rank order),
    # every ring's hops running at once
    next_link: np.ndarray  # (pp, dp) slowest shard-to-shard flow from stage j to stage (j+1) mod pp, the boundary's
    # flows running at once
    replica_class: np.ndarray  # (dp,) replicas with equal pace, tp_ring and next_link share a class
    class_replica: np.ndarray  # (classes,) the first replica of each class
    stage_types: tuple[tuple[int, ...], ...]  # [stage] type indices present, increasing
    stage_pace: tuple[tuple[int, ...], ...]  # [stage] distinct pace-setting type indices, increasing
    stage_pairs: tuple[tuple[tuple[int, float], ...], ...]  # [stage] distinct (pace type, tp_ring), increasing
    bandwidth: LinkBandwidth  # the cluster's links (not a copy)
    memo: dict = field(default_factory=dict, repr=False)  # terms of the estimates of this layout (CostModel._timing)

    def stage_devices(self, stage: int, replica: int) -> tuple[int, ...]:
        """Device ids of one tensor-parallel group (``Strategy.stage_devices``)."""
        return tuple(int(d) for d in self.grid[stage, replica])

    def boundary_links(self, replica: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(pp,) per device stage j: the flow bandwidth from stage j to (j+1) mod pp and the slower of the two
        stages' tensor-parallel rings (bytes/s; :func:`~ampe.costmodel.comm.pipe_transfer_s`), of ``replica``, or
        the slowest over the replicas."""
        ring = np.minimum(self.tp_ring, np.roll(self.tp_ring, -1, axis=0))
        if replica is not None:
            return self.next_link[:, replica], ring[:, replica]
        return self.next_link.min(axis=1), ring.min(axis=1)

    def ring_min(self, ring_stages: list[int]) -> float:
        """Slowest hop over every (replica, shard) of the rings through ``ring_stages`` (in that order, wrapping
        around): the tied-weight all-reduce rings; ``inf`` for fewer than two stages."""
        if len(ring_stages) < 2:
            return float("inf")
        g = self.grid[ring_stages]
        return float(_hops(self.bandwidth, g, 0).min())


def signature(lay: DeviceLayout, tied_rings: list[list[int]]) -> bytes:
    """A digest of every placement-dependent input of the cost terms (pace-setters, tensor-parallel rings and
    stage-to-stage links per replica, each stage's slowest data-parallel ring, the GPU types on each stage, and the
    slowest hop of the tied-weight rings through each stage list of ``tied_rings``): two placements of the same
    degrees with equal signatures get equal stage tables, and equal times and per-stage memory for every partition
    whose tied weights sit on one of ``tied_rings``."""
    parts = [np.array(lay.grid.shape, dtype=np.int64), lay.pace, lay.tp_ring, lay.next_link, lay.dp_ring.min(axis=1),
             np.array([t for ts in lay.stage_types for t in (*ts, -1)], dtype=np.int64),
             np.array([lay.ring_min(r) for r in tied_rings])]
    h = hashlib.blake2b(digest_size=20)
    for a in parts:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.digest()


def _hops(bw: LinkBandwidth, grid: np.ndarray, axis: int, shared: bool = False) -> np.ndarray:
    """Slowest hop of the rings along ``axis`` of ``grid`` (each member to the next, the last to the first);
    ``shared``: with every hop of every ring running at once."""
    if grid.shape[axis] < 2:
        return np.full(np.delete(grid.shape, axis), np.inf)
    nxt = np.roll(grid, -1, axis=axis)
    return (bw.concurrent(grid, nxt) if shared else bw[grid, nxt]).min(axis=axis)


def _links_to_next(bw: LinkBandwidth, grid: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(len(rows), dp) slowest flow of each replica from stage j to stage (j+1) mod pp for j in ``rows``, each
    boundary's flows (every replica and shard) running at once."""
    pp = grid.shape[0]
    group = np.arange(len(rows))[:, None, None]
    return bw.concurrent(grid[rows], grid[(rows + 1) % pp], group).min(axis=2)


def _classes(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Equal rows of ``rows`` as classes numbered by first appearance: (class of each row, first row of each
    class). Sorting the rows (lexsort) finds them in O(n log n) without Python per row."""
    n = rows.shape[0]
    order = np.lexsort(rows.T[::-1])
    ordered = rows[order]
    starts = np.ones(n, dtype=bool)
    starts[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
    group = np.cumsum(starts) - 1  # class in sorted order, per sorted row
    first = np.minimum.reduceat(order, np.flatnonzero(starts))  # each class's first row
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    replica_class = np.empty(n, dtype=np.int64)
    replica_class[order] = rank[group]
    return replica_class, np.sort(first)


def _type_sets(ty: np.ndarray, n_types: int) -> tuple[tuple[int, ...], ...]:
    """[stage] the type indices present in each row of ``ty`` (stage × devices), increasing."""
    pp = ty.shape[0]
    present = np.zeros((pp, n_types), dtype=bool)
    present[np.repeat(np.arange(pp), ty.shape[1]), ty.reshape(-1)] = True
    return tuple(tuple(int(t) for t in np.flatnonzero(row)) for row in present)


def stage_types(types: DeviceTypes, pp: int, placement: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """``DeviceLayout.stage_types`` of a placement without the rest of its layout (device id per global rank,
    ``pp`` stages of consecutive ranks)."""
    ty = types.of_device[np.asarray(placement, dtype=np.int64)]
    return _type_sets(ty.reshape(pp, -1), len(types.gpus))


def device_layout(cluster: Cluster, types: DeviceTypes, pp: int, dp: int, tp: int,
                  placement: tuple[int, ...]) -> DeviceLayout:
    """The arrays of :class:`DeviceLayout` for one placement (device id per global rank)."""
    bw = cluster.bandwidth
    grid = np.asarray(placement, dtype=np.int64).reshape(pp, dp, tp)
    ty = types.of_device[grid]
    pace_rank = types.pace_rank[ty].max(axis=2)
    by_rank = np.argsort(types.pace_rank)  # type index of each rank
    pace = by_rank[pace_rank]
    tp_ring = _hops(bw, grid, 2)
    dp_ring = _hops(bw, grid, 1, shared=True)
    next_link = _links_to_next(bw, grid, np.arange(pp))
    replica_class, class_replica = _classes(np.concatenate([pace.T.astype(float), tp_ring.T, next_link.T], axis=1))
    stage_types = _type_sets(ty.reshape(pp, dp * tp), len(types.gpus))
    # replicas of one class have equal rows, so one replica per class shows every distinct value
    reps_pace, reps_ring = pace[:, class_replica].tolist(), tp_ring[:, class_replica].tolist()
    stage_pace = tuple(tuple(sorted(set(row))) for row in reps_pace)
    stage_pairs = tuple(tuple(sorted(set(zip(p, b, strict=True)))) for p, b in zip(reps_pace, reps_ring, strict=True))
    return DeviceLayout(grid, ty, pace, tp_ring, dp_ring, next_link, replica_class, class_replica, stage_types,
                        stage_pace, stage_pairs, bw)


def swap_stages(lay: DeviceLayout, a: int, b: int) -> DeviceLayout:
    """The layout of ``lay``'s placement with the device blocks of stages ``a`` and ``b`` swapped (the local search's
    neighbours): rows a and b of every per-stage array trade places, the stage-to-stage links that touch them are
    taken again, and the replica classes are found again. The same values as :func:`device_layout` of the swapped
    placement (a block keeps its order, so its rings and its types move with it, and every ring still runs beside the
    same others; the per-stage distinct values are over all replicas, whatever the classes)."""
    pp = lay.grid.shape[0]
    order = np.arange(pp)
    order[a], order[b] = b, a
    grid, ty = lay.grid[order], lay.types[order]
    pace, tp_ring, dp_ring, next_link = lay.pace[order], lay.tp_ring[order], lay.dp_ring[order], lay.next_link[order]
    rows = np.array(sorted({(a - 1) % pp, a, (b - 1) % pp, b}), dtype=np.int64)
    next_link[rows] = _links_to_next(lay.bandwidth, grid, rows)
    replica_class, class_replica = _classes(np.concatenate([pace.T.astype(float), tp_ring.T, next_link.T], axis=1))

    def swapped(t: tuple) -> tuple:
        out = list(t)
        out[a], out[b] = out[b], out[a]
        return tuple(out)

    return DeviceLayout(grid, ty, pace, tp_ring, dp_ring, next_link, replica_class, class_replica,
                        swapped(lay.stage_types), swapped(lay.stage_pace), swapped(lay.stage_pairs), lay.bandwidth)
