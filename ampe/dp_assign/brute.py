"""Brute force over every contiguous partition: the oracle the exact solver is tested against (small L only)."""

from __future__ import annotations

import itertools
import math

from ampe.dp_assign.costs import PARTITION_OBJECTIVES, Assignment, StageCosts, evaluate_partition

MAX_PARTITIONS = 2_000_000


def all_partitions(num_layers: int, pp: int):
    """Every DeepSpeed ``parts`` list with pp non-empty stages over num_layers layers (C(L-1, pp-1) of them)."""
    for cuts in itertools.combinations(range(1, num_layers), pp - 1):
        yield (0, *cuts, num_layers)


def brute_force(costs: StageCosts, objective: str = "full") -> list[Assignment]:
    """All partitions that fit in memory and avoid forbidden cuts, sorted by ``objective`` (best first).

    Empty when none qualifies. Refuses instances with more than ``MAX_PARTITIONS`` partitions.
    """
    if objective not in PARTITION_OBJECTIVES:
        raise ValueError(f"objective must be one of {PARTITION_OBJECTIVES}, got {objective!r}")
    pp, num_layers = costs.pp, costs.num_layers
    if pp > num_layers:
        return []
    count = math.comb(num_layers - 1, pp - 1)
    if count > MAX_PARTITIONS:
        raise ValueError(f"{count} partitions is too many for brute force (limit {MAX_PARTITIONS})")
    out = []
    for p in all_partitions(num_layers, pp):
        a = evaluate_partition(costs, p)
        if a.fits and math.isfinite(a.eq5_s):
            out.append(a)
    out.sort(key=lambda a: (a.objective(objective), a.partition))
    return out
