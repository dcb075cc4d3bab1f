"""Re-planning a strategy after the cluster changed (a node died, a GPU turned slow, nodes came back): warm-started
from the old strategy, ties broken toward the smallest change (docs/replan.md).

Candidates, in the order they are costed:

1. the old strategy adapted: same degrees and partition, each surviving rank on its device, the ranks of devices
   gone on free devices (a whole dead node's ranks on one free node of that GPU type where there is one); then the
   same placement re-partitioned (the exact DP, each stage with its memory options);
2. the nearest feasible degrees when the free devices do not suffice: fewer data-parallel replicas (the largest dp
   dividing the global batch; the replicas with the fewest dead ranks stay, the others' devices fill the holes),
   or more replicas where added nodes allow; old partition, then re-partitioned;
3. the search's placements (device orders × layouts) of each of those degrees on the same devices, each skipped
   where the branch-and-bound lower bound (:func:`~ampe.search.engine.cannot_beat`) shows it cannot come within the
   tie tolerance of the best so far.

Among the strategies within :data:`TIE_TOLERANCE` of the fastest, the one with the smallest change distance wins
(ranks whose device changes + layers that change stage), then the fastest.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from ampe.costmodel.cluster import Cluster
from ampe.costmodel.estimate import CostModel, Estimate
from ampe.costmodel.strategy import Strategy, shares_label, strategy_identity
from ampe.search.engine import Memo, SearchOptions, best_for_placement, cannot_beat, search
from ampe.search.placement import candidates, device_orders
from ampe.search.shares import with_best_shares
from ampe.search.space import Degrees, divisors

TIE_TOLERANCE = 0.005  # strategies within 0.5 % of the fastest count as tied: the smallest change wins
_Start = tuple[int, int, tuple[int, ...], str]  # (pp, dp, placement on the new cluster, label): adapted_placements

_log = logging.getLogger(__name__)  # diagnostics; the CLI installs the handler that prints them


@dataclass(frozen=True)
class Change:
    """How far a new strategy is from the old one (:func:`change_between`)."""

    ranks_moved: int  # new ranks whose device did not run the same stage (and tensor-parallel shard) before
    layers_moved: int  # layers now on a stage other than the one that holds them before
    ranks_dropped: int  # old ranks whose device runs none of the new strategy's ranks in that role
    moved: tuple[int, ...] = ()  # the new ranks that moved
    stage_was: tuple[int, ...] = ()  # per new stage: the old stage it continues (−1: none; stage_alignment)

    @property
    def distance(self) -> int:
        """The tie-breaking distance: ranks moved + layers moved."""
        return self.ranks_moved + self.layers_moved


@dataclass(frozen=True)
class ReplanOption:
    """One costed re-plan candidate."""

    estimate: Estimate
    how: str  # e.g. "same degrees, old partition", "dp 4→3, re-partitioned", "megatron/given placement"
    change: Change

    @property
    def strategy(self) -> Strategy:
        return self.estimate.strategy


@dataclass(frozen=True)
class ClusterReplan:
    """The chosen strategy, every fitting candidate (fastest first) and what the re-plan did (seconds)."""

    chosen: ReplanOption
    options: tuple[ReplanOption, ...]
    evaluated: int  # candidates costed
    skipped: int  # candidates the lower bound ruled out
    seconds: float  # wall
    cpu_seconds: float  # this process's CPU time


def change_between(old: Strategy, new: Strategy, new_to_old: dict[int, int]) -> Change:
    """:class:`Change` of ``new`` (device ids of the new cluster) against ``old`` (ids of the old one). Each new
    stage continues at most one old stage, in order (:func:`stage_alignment`), the matching that keeps the most
    ranks and layers in place. A new rank stays when its device ran a rank of the old stage its stage continues,
    with the same tensor-parallel shard (the replica index may differ); a layer moves when its new stage continues
    another old stage than the one that held it. So the distance (ranks moved + layers moved) is the smallest over
    order-keeping stage matchings."""
    assert old.placement is not None and new.placement is not None
    roles: dict[int, set[tuple[int, int]]] = {}
    for rank, dev in enumerate(old.placement):
        roles.setdefault(dev, set()).add((rank // (old.dp * old.tp), rank % old.tp))
    score = [[0] * old.pp for _ in range(new.pp)]
    for rank, dev in enumerate(new.placement):
        i, k = rank // (new.dp * new.tp), rank % new.tp
        for j, kk in roles.get(new_to_old.get(dev, -1), ()):
            if kk == k:
                score[i][j] += 1
    old_st, new_st = layer_stages(old), layer_stages(new)
    if old_st and new_st:
        for a, b in zip(old_st, new_st, strict=True):
            score[b][a] += 1
    was = stage_alignment(score)
    layers = sum(a != was[b] for a, b in zip(old_st, new_st, strict=True)) if old_st and new_st else 0
    moved = []
    kept_old: set[int] = set()
    for rank, dev in enumerate(new.placement):
        prev = new_to_old.get(dev)
        if prev is not None and (was[rank // (new.dp * new.tp)], rank % new.tp) in roles.get(prev, set()):
            kept_old.add(prev)
        else:
            moved.append(rank)
    return Change(len(moved), layers, len(set(old.placement) - kept_old), tuple(moved), was)


def stage_alignment(score: list[list[int]]) -> tuple[int, ...]:
    """Per new stage i, the old stage it continues (−1: none): the order-keeping one-to-one matching of new stages
    (rows of ``score``) to old ones (columns) with the largest total ``score`` (ties: the earlier old stages).
    With as many stages and no better matching it is the identity; with fewer new stages some old ones are
    dropped, with more some new ones continue none."""
    m, n = len(score), len(score[0]) if score else 0
    if m > n:  # more stages now: match the old ones into the new ones
        back = stage_alignment([list(col) for col in zip(*score, strict=True)])
        out = [-1] * m
        for j, i in enumerate(back):
            out[i] = j
        return tuple(out)
    neg = -(1 << 60)
    f = [[0] * (n + 1)] + [[neg] * (n + 1) for _ in range(m)]  # f[i][j]: first i new stages in first j old
    for i in range(1, m + 1):
        for j in range(i, n + 1):
            f[i][j] = max(f[i][j - 1], f[i - 1][j - 1] + score[i - 1][j - 1])
    out, j = [0] * m, n
    for i in range(m, 0, -1):
        while j > i and f[i][j] == f[i][j - 1]:
            j -= 1
        out[i - 1] = j - 1
        j -= 1
    return tuple(out)


def layer_stages(s: Strategy) -> tuple[int, ...]:
    """The pipeline (device) stage of each layer: its partition chunk, modulo pp under the interleaved schedule;
    () without a partition."""
    if s.partition is None:
        return ()
    out: list[int] = []
    for c in range(len(s.partition) - 1):
        out += [c % s.pp] * (s.partition[c + 1] - s.partition[c])
    return tuple(out)


def adapted_placements(old: Strategy, old_cluster: Cluster, new: Cluster, old_to_new: dict[int, int],
                       num_layers: int) -> list[_Start]:
    """(pp, dp, placement on ``new``, label) of the old strategy adapted, tp kept: the same degrees where the free
    devices replace the dead ranks; else the largest smaller dp dividing the global batch, and the largest smaller
    pp, that the devices hold; the largest larger dp and pp that free (added) devices allow. Kept replicas and
    stages keep their order and their ranks stay on their devices; the replicas (stages) dropped first are those
    with the most dead ranks, then the most stragglers, then the last."""
    assert old.placement is not None
    tp = old.tp

    def dev(j: int, r: int, k: int) -> int:
        return old.placement[j * old.dp * tp + r * tp + k]  # type: ignore[index]

    def bad(d: int) -> tuple[int, int]:
        return (d not in old_to_new, d in old_to_new and new.devices[old_to_new[d]].gpu.slowdown > 1)

    rep_bad = [tuple(map(sum, zip(*(bad(dev(j, r, k)) for j in range(old.pp) for k in range(tp)), strict=True)))
               for r in range(old.dp)]
    stage_bad = [tuple(map(sum, zip(*(bad(dev(j, r, k)) for r in range(old.dp) for k in range(tp)), strict=True)))
                 for j in range(old.pp)]
    damaged = any(any(b) for b in rep_bad)
    alive_used = {old_to_new[d] for d in old.placement if d in old_to_new}
    spare = [d.id for d in new.devices if d.id not in alive_used]
    dps = [q for q in divisors(old.gbs) if q * tp <= new.size]
    shapes: list[tuple[int, int, str]] = [(old.pp, old.dp, "same degrees" if damaged else "same placement")]
    if damaged:
        shapes += [(old.pp, q, f"dp {old.dp}→{q}") for q in reversed(dps) if q < old.dp][:1]
        pps = [p for p in range(old.pp - 1, 0, -1) if p * old.dp * tp <= new.size]
        shapes += [(p, old.dp, f"pp {old.pp}→{p}") for p in pps[:1]]
    shapes += [(old.pp, q, f"dp {old.dp}→{q}") for q in reversed(dps) if q > old.dp and
               q * old.pp * tp <= new.size][:1]
    shapes += [(p, old.dp, f"pp {old.pp}→{p}") for p in range(min(num_layers, new.size // (old.dp * tp)), old.pp, -1)
               ][:1]
    out: list[tuple[int, int, tuple[int, ...], str]] = []
    slow = [d for d in old.placement if d in old_to_new and new.devices[old_to_new[d]].gpu.slowdown > 1]
    if slow and spare:
        # stragglers replaced by free devices: the straggler alone, and with its node's other ranks
        nodes = {old_cluster.devices[d].node for d in slow}
        for label, avoid in (("stragglers replaced", set(slow)),
                             ("stragglers' nodes replaced", {d for d in old.placement
                                                             if old_cluster.devices[d].node in nodes})):
            healthy = {k: v for k, v in old_to_new.items() if k not in avoid}
            pl = _fill(old, old_cluster, new, healthy, list(range(old.pp)), list(range(old.dp)), spare)
            if pl is not None and all(p[2] != pl for p in out):
                out.append((old.pp, old.dp, pl, label))
    for pp, dp, label in shapes:
        if pp * dp * tp > new.size:
            continue
        reps = sorted(range(old.dp), key=lambda r: (rep_bad[r], -r))  # best first
        stgs = sorted(range(old.pp), key=lambda j: (stage_bad[j], -j))
        keep_r = sorted(reps[:dp]) + [None] * max(0, dp - old.dp)
        keep_j = sorted(stgs[:pp]) + [None] * max(0, pp - old.pp)
        kept = {dev(j, r, k) for j in keep_j if j is not None for r in keep_r if r is not None for k in range(tp)}
        freed = [old_to_new[d] for d in old.placement if d in old_to_new and d not in kept]
        pl = _fill(old, old_cluster, new, old_to_new, keep_j, keep_r, sorted(set(spare) | set(freed)))
        if pl is not None:
            out.append((pp, dp, pl, label))
    return out


def _fill(old: Strategy, old_cluster: Cluster, new: Cluster, old_to_new: dict[int, int],
          stages: list[int | None], replicas: list[int | None], free: list[int]) -> tuple[int, ...] | None:
    """Placement on ``new`` of new stage j' ← old stage ``stages[j']`` and replica q ← old ``replicas[q]`` (None:
    a new one): surviving ranks where they were; dead ranks on ``free`` devices, a dead node's ranks on one free
    node of its GPU type when one has room, else on free devices of the same type, else any (stragglers last); new
    stages and replicas on the rest, node by node. None when the free devices do not suffice."""
    assert old.placement is not None
    pp, dp, tp = len(stages), len(replicas), old.tp
    pl: list[int | None] = [None] * (pp * dp * tp)
    holes: dict[str, list[tuple[int, str]]] = {}  # old node -> (new rank, GPU type)
    fresh: list[int] = []
    for jn, j in enumerate(stages):
        for q, r in enumerate(replicas):
            for k in range(tp):
                rank = jn * dp * tp + q * tp + k
                if j is None or r is None:
                    fresh.append(rank)
                    continue
                d = old.placement[j * old.dp * tp + r * tp + k]
                if d in old_to_new:
                    pl[rank] = old_to_new[d]
                else:
                    dd = old_cluster.devices[d]
                    holes.setdefault(dd.node, []).append((rank, dd.gpu.healthy().name))
    taken = {p for p in pl if p is not None}
    # free stragglers last: a dead rank goes to a healthy device where there is one
    left = sorted((d for d in free if d not in taken), key=lambda d: new.devices[d].gpu.slowdown > 1)
    node_of = {d.id: d.node for d in new.devices}
    type_of = {d.id: d.gpu.healthy().name for d in new.devices}
    for group in holes.values():
        want = group[0][1]
        by_node: dict[str, list[int]] = {}
        for d in left:
            if type_of[d] == want and new.devices[d].gpu.slowdown == 1:
                by_node.setdefault(node_of[d], []).append(d)
        room = next((devs for devs in by_node.values() if len(devs) >= len(group)), None)
        for n, (rank, gpu) in enumerate(group):
            pick = room[n] if room is not None else next((d for d in left if type_of[d] == gpu),
                                                         left[0] if left else -1)
            if pick < 0:
                return None
            pl[rank] = pick
            left.remove(pick)
    if len(fresh) > len(left):
        return None
    for rank, d in zip(fresh, left, strict=False):
        pl[rank] = d
    return tuple(p for p in pl if p is not None)


def _valid(d: Degrees, num_layers: int) -> bool:
    """Whether the search's space has ``d`` (:func:`~ampe.search.space.enumerate_degrees`' rules)."""
    if d.pp * d.virtual_stages > num_layers or d.gbs % (d.dp * d.mbs):
        return False
    return d.schedule != "interleaved" or (d.pp >= 2 and d.gas % d.pp == 0)


def _mbs_choices(old: Strategy, dp: int) -> list[int]:
    """Micro-batch sizes tried at ``dp``: the old one, half and double, where they divide the per-replica batch;
    else the largest divisor not above the old one."""
    per = old.gbs // dp
    tries = [m for m in dict.fromkeys((old.mbs, old.mbs // 2, old.mbs * 2)) if m >= 1 and per % m == 0]
    return tries or [max(m for m in divisors(per) if m <= max(old.mbs, 1))]


def _own_uneven_shares(cm: CostModel, old: Strategy, starts: list[tuple[int, int, tuple[int, ...], str]],
                       add: Callable[[Estimate | None, str], None]) -> int:
    """Shares need not divide the batch evenly: a hand-written plan's uneven shares whose batch dp·mbs does not
    divide (the search's space, equal shares and re-partitioning of those degrees all need it to) are costed at its
    own degrees with its old partition, on each adapted placement of them. Returns the candidates costed."""
    if old.replica_gas is None or old.gbs % (old.dp * old.mbs) == 0:
        return 0
    own = [(pl, label) for pp, dp, pl, label in starts if (pp, dp) == (old.pp, old.dp)]
    for pl, label in own:
        add(cm.estimate(replace(old, placement=pl)), f"{label}, old partition")
    return len(own)


def replan_cluster(cm: CostModel, old: Strategy, old_cluster: Cluster, old_to_new: dict[int, int],
                   opts: SearchOptions, full_search: bool = False) -> ClusterReplan | None:
    """Re-plan ``old`` for ``cm``'s cluster (the cluster as it now is).

    Args:
        cm: the cost model of the new cluster.
        old: the strategy running before the change (device ids of ``old_cluster``).
        old_cluster: the cluster before the change.
        old_to_new: device id before → after, for the devices both have.
        opts: the search's knobs (orders, layouts, memory options, method).
        full_search: also a whole search on the new cluster (when it has layouts) and on the devices the best warm
            start uses (a search that fits nothing is logged, at INFO on this module's logger).

    Returns:
        The chosen candidate, every fitting one (fastest first; times in s) and the work done (candidates, s); None
        when no candidate fits.
    """
    t0, c0 = time.perf_counter(), time.process_time()
    pool = _Pool(old, {v: k for k, v in old_to_new.items()})
    memo = Memo()
    starts = adapted_placements(old, old_cluster, cm.cluster, old_to_new, cm.model.num_layers)
    pool.evaluated += _own_uneven_shares(cm, old, starts, pool.add)
    tried = _warm_starts(cm, old, starts, opts, memo, pool)
    _searched_placements(cm, old, starts, opts, memo, pool, tried)
    if full_search:
        _full_searches(cm, opts, pool)
    if not pool.options:
        return None
    ranked = sorted(pool.options, key=lambda o: (o.estimate.iteration_s, o.change.distance))
    chosen = pick(ranked)
    return ClusterReplan(chosen, tuple(ranked), pool.evaluated, pool.skipped, time.perf_counter() - t0,
                         time.process_time() - c0)


@dataclass
class _Pool:
    """The fitting candidates costed so far (each strategy once: the first, warm-start name kept), the fastest of
    them (s) and the count of candidates costed and ruled out."""

    old: Strategy
    new_to_old: dict[int, int]
    options: list[ReplanOption] = field(default_factory=list)
    seen: set[tuple] = field(default_factory=set)
    best: float = float("inf")
    evaluated: int = 0
    skipped: int = 0

    def add(self, est: Estimate | None, how: str) -> None:
        """Keep ``est`` as a candidate named ``how`` when it fits within capacity and is new."""
        if est is None or not est.within_capacity:
            return
        key = (strategy_identity(est.strategy), est.strategy.replica_gas)
        if key in self.seen:  # found again (by the search): keep the first, warm-start name
            return
        self.seen.add(key)
        self.options.append(ReplanOption(est, how, change_between(self.old, est.strategy, self.new_to_old)))
        self.best = min(self.best, est.iteration_s)


def _warm_starts(cm: CostModel, old: Strategy, starts: list[_Start], opts: SearchOptions, memo: Memo,
                 pool: _Pool) -> set[tuple]:
    """Cost the adapted placements (old partition, equal and moved shares, re-partitioned) of each micro-batch
    size tried; returns the (pp, dp, mbs, placement) tried."""
    tried: set[tuple] = set()
    for pp, dp, pl, label in starts:
        for mbs in _mbs_choices(old, dp):
            d = Degrees(pp, dp, old.tp, mbs, old.gbs, old.schedule, old.virtual_stages, old.expandable_segments)
            if not _valid(d, cm.model.num_layers):
                continue
            tag = label + ("" if mbs == old.mbs else f", mbs {old.mbs}→{mbs}")
            if pp == old.pp:
                pool.evaluated += 1
                adapted = replace(old, dp=dp, mbs=mbs, placement=pl, zero=old.zero if dp > 1 else 0,
                                  replica_gas=old.replica_gas if (dp, mbs) == (old.dp, old.mbs) else None)
                pool.add(cm.estimate(adapted), f"{tag}, old partition")
                if opts.shares == "auto" and dp > 1:  # samples moved away from a slowed replica
                    pool.evaluated += 1
                    even = cm.estimate(replace(adapted, replica_gas=None))
                    pool.add(even, f"{tag}, old partition, equal shares")
                    moved = with_best_shares(cm, even, opts.method)
                    pool.add(moved, f"{tag}, old partition, shares {shares_label(moved.strategy)}")
            pool.evaluated += 1
            pool.add(best_for_placement(cm, d, pl, opts.rerank, opts.method, opts.recompute, opts.zero, memo),
                     f"{tag}, re-partitioned")
            tried.add((pp, dp, mbs, pl))
    return tried


def _searched_placements(cm: CostModel, old: Strategy, starts: list[_Start], opts: SearchOptions, memo: Memo,
                         pool: _Pool, tried: set[tuple]) -> None:
    """Cost the search's placements of the same degrees on the same devices, each skipped where the lower bound
    shows it cannot come within the tie tolerance of the best so far."""
    for pp, dp, pl, label in starts:
        sub_ids = sorted(set(pl))
        sub = cm.cluster.subset(sub_ids)
        made = device_orders(sub, cm.slowness, opts.orders)
        for mbs in _mbs_choices(old, dp):
            d = Degrees(pp, dp, old.tp, mbs, old.gbs, old.schedule, old.virtual_stages, old.expandable_segments)
            if not _valid(d, cm.model.num_layers):
                continue
            for p in candidates(sub, pp, dp, old.tp, cm.slowness, opts.orders, opts.layouts, made):
                devs = tuple(sub_ids[i] for i in p.devices)
                if (pp, dp, mbs, devs) in tried:
                    continue
                tried.add((pp, dp, mbs, devs))
                if pool.best < float("inf") and cannot_beat(cm, d, devs, pool.best * (1 + TIE_TOLERANCE),
                                                            opts.method, opts.recompute, opts.zero, memo.slices):
                    pool.skipped += 1
                    continue
                pool.evaluated += 1
                pool.add(best_for_placement(cm, d, devs, opts.rerank, opts.method, opts.recompute, opts.zero, memo),
                         f"{label}, {p.name} placement" + ("" if mbs == old.mbs else f", mbs {mbs}"))


def _full_searches(cm: CostModel, opts: SearchOptions, pool: _Pool) -> None:
    """Add the top strategies of a whole search on the new cluster and on the devices the best candidate so far
    uses (when it leaves some out)."""
    new = cm.cluster
    parts: list[tuple[str, list[int]]] = [("full search", list(range(new.size)))]
    if pool.options:
        used = sorted(set(min(pool.options, key=lambda o: o.estimate.iteration_s).strategy.placement or ()))
        if len(used) < new.size:
            parts.append((f"full search on {len(used)} devices", used))
    for label, ids in parts:
        sub = new if len(ids) == new.size else new.subset(ids)
        try:
            res = search(sub, cm.model, cm.profile, opts)
        except ValueError:
            continue
        pool.evaluated += res.candidates
        if not res.ranked:
            _log.info("%s: no strategy fits", label)
        for c in res.ranked[: opts.top_k]:
            s = c.strategy
            assert s.placement is not None
            pool.add(cm.estimate(replace(s, placement=tuple(ids[i] for i in s.placement))), f"{label}, "
                     f"{c.placement_name}")


def pick(options: list[ReplanOption], tolerance: float = TIE_TOLERANCE,
         scores: Sequence[float | None] | None = None) -> ReplanOption:
    """The option with the smallest change distance among those within ``tolerance`` (relative) of the best;
    ties: the better score, then the earlier.

    Args:
        options: the costed candidates.
        tolerance: the relative margin that counts as a tie (0.005: 0.5 %).
        scores: per option, what is minimised (s, J, money or g CO2e per iteration; None: not eligible, e.g.
            beyond an objective's slowdown bound); default each option's iteration time (s).

    Returns:
        The chosen option.
    """
    score = [o.estimate.iteration_s for o in options] if scores is None else list(scores)
    best = min(x for x in score if x is not None)
    near = [(o.change.distance, x, i) for i, (o, x) in enumerate(zip(options, score, strict=True))
            if x is not None and x <= best + tolerance * abs(best)]
    return options[min(near)[2]]
