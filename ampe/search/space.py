"""The search space: parallel degrees, micro-batch sizes and schedules.

* (pp, dp, tp) with pp·dp·tp = number of devices and pp·v ≤ layers;
* by default tp stays inside a node: it must divide the GPU count of every node (so Megatron-order placement puts
  every tensor-parallel group on one node); ``allow_cross_node_tp`` lifts that;
* dp divides the global batch and mbs divides gbs/dp;
* schedules: 1F1B by default; GPipe and interleaved 1F1B (v = 2 virtual stages, gas a multiple of pp) on request.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from ampe.costmodel.cluster import Cluster


def divisors(n: int) -> list[int]:
    """All positive divisors of ``n`` in increasing order."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


@dataclass(frozen=True)
class Degrees:
    """One (pp, dp, tp, mbs, schedule) point, before placement and partition."""

    pp: int
    dp: int
    tp: int
    mbs: int
    gbs: int
    schedule: str = "1f1b"
    virtual_stages: int = 1
    expandable_segments: bool | None = None  # the allocator setting every strategy of the search runs with

    @property
    def gas(self) -> int:
        """Micro-batches per pipeline per iteration."""
        return self.gbs // (self.dp * self.mbs)


def node_gcd(cluster: Cluster) -> int:
    """Greatest common divisor of the nodes' GPU counts (the largest tp that stays inside every node)."""
    g = 0
    for devs in cluster.node_devices().values():
        g = gcd(g, len(devs))
    return max(g, 1)


def enumerate_degrees(
    cluster: Cluster,
    num_layers: int,
    gbs: int,
    allow_cross_node_tp: bool = False,
    max_tp: int | None = None,
    schedules: tuple[str, ...] = ("1f1b",),
    mbs_choices: tuple[int, ...] | None = None,
    expandable_segments: bool | None = None,
) -> list[Degrees]:
    """Every valid (pp, dp, tp, mbs, schedule) for ``cluster`` and global batch ``gbs``, each with the allocator
    setting ``expandable_segments``."""
    n = cluster.size
    tp_limit = n if allow_cross_node_tp else node_gcd(cluster)
    if max_tp is not None:
        tp_limit = min(tp_limit, max_tp)
    out: list[Degrees] = []
    for tp in divisors(n):
        if tp > tp_limit or (not allow_cross_node_tp and node_gcd(cluster) % tp):
            continue
        for dp in divisors(n // tp):
            pp = n // (tp * dp)
            if gbs % dp or pp > num_layers:
                continue
            for mbs in divisors(gbs // dp):
                if mbs_choices is not None and mbs not in mbs_choices:
                    continue
                gas = gbs // (dp * mbs)
                for sched in schedules:
                    if sched == "interleaved":
                        v = 2
                        if pp < 2 or gas % pp or pp * v > num_layers:
                            continue
                        out.append(Degrees(pp, dp, tp, mbs, gbs, sched, v, expandable_segments))
                    elif sched == "gpipe" and pp == 1:
                        continue  # identical to 1F1B without a pipeline
                    else:
                        out.append(Degrees(pp, dp, tp, mbs, gbs, sched, 1, expandable_segments))
    return out
