"""Money and CO2e of a strategy's operating points (the cheapest one: :mod:`ampe.energy.objective`).

A point of a strategy (synchronous pipeline time T', every replica r at one point p_r of its frontier, iteration
time T = T' + post) costs (:mod:`ampe.costmodel.pricing` gives the weights)::

    cost(T', p) = a · T  +  Σ_r Σ_s w_rs · (eff_rs(p_r) + P_block,rs · T)

with ``a`` the rent of every device the strategy holds (units/s), ``w_rs`` the units per joule of device stage s
of replica r (electricity price or carbon intensity × PUE), ``eff_rs`` the stage's effective energy (Eq. 4: its
computations' energy less blocking power × their time) and ``P_block,rs`` its blocking power: the energy
accounting of :mod:`ampe.energy.strategy` (all devices, waiting and the tail at blocking power), each device's
joules priced at its own site.

**The cheapest point is exact over the frontier's points.** For a fixed T' the rent and the blocking terms are
fixed and each replica independently takes, among its frontier points not slower than T', the one of least weighted
effective energy (a prefix minimum along the points sorted by time). Between two consecutive point times the
choices stay the same and the cost only grows with T', so the optimum lies at T' = the fastest synchronous time or
at one of the points' times: the ``cost`` and ``carbon`` objectives (:mod:`ampe.energy.objective`) scan exactly
those.

**And the frontier is the priced one.** The cost-optimal clock plan minimises a·T + b·E, a linear objective, so it
is a point of the time–(weighted) energy Pareto set. Where every stage of a replica is priced alike (one site, or a
site per replica) its weighted joules are a multiple of its joules and the plain time–energy frontier is that set.
Where one replica's stages sit at sites of different prices, :func:`~ampe.energy.strategy.plan_clocks` (given the
weights) traces that replica's frontier on weighted joules (``PipelineInputs.energy_weight``: each stage's
energies and blocking power × its relative price) and evaluates its points back in joules. Either way the cheapest
point is the optimum over all clock plans up to the frontier's own accuracy (τ and the convex relaxation,
docs/energy.md §4).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ampe.costmodel.pricing import Weights
from ampe.tradeoff.evaluate import OptionTable

if TYPE_CHECKING:
    from ampe.energy.strategy import ReplicaDag, ReplicaPipeline, StrategyEnergy, StrategyPoint

_REL = 1e-12
_BATCH = 64  # frontier points whose per-stage energies are summed at once (64 × DAG nodes floats)


@dataclass(frozen=True)
class PointCost:
    """One iteration at one point, in the weights' units (currency or grams CO2e): ``time_part`` (device rent over
    the iteration time) and ``energy_part`` (every device's joules × PUE × its site's price or intensity)."""

    time_part: float
    energy_part: float

    @property
    def total(self) -> float:
        """Rent plus energy."""
        return self.time_part + self.energy_part


def stage_effective_j(rep: ReplicaPipeline, choices: Sequence[np.ndarray], table: OptionTable | None = None
                      ) -> np.ndarray:
    """Per choice (a frontier point's option per DAG node), the effective energy of every device stage (J), a
    ``len(choices) × stages`` array; their row sums are the points' ``effective_j``."""
    dag = rep.dag
    table = table or OptionTable.of(dag)
    rows = np.arange(len(dag.nodes))
    onehot = np.zeros((len(dag.nodes), dag.num_stages))
    onehot[rows, dag.node_stage] = 1.0
    out = []
    for k in range(0, len(choices), _BATCH):
        batch = np.stack([np.asarray(c, dtype=np.int64) for c in choices[k:k + _BATCH]])
        out.append(table.effective_j[rows, batch] @ onehot)  # transfers' effective energy is 0
    return np.concatenate(out) if out else np.zeros((0, dag.num_stages))


def weighted_effective(rep: ReplicaPipeline, w: Sequence[float]) -> np.ndarray:
    """Weighted effective energy of every point of the replica's frontier (units)."""
    points = rep.frontier.points
    if all(x == w[0] for x in w):
        return w[0] * np.array([p.effective_j for p in points])
    return stage_effective_j(rep, [p.choice for p in points]) @ np.asarray(w, dtype=float)


def blocking_weighted(rep: ReplicaPipeline, w: Sequence[float]) -> float:
    """Σ_s w_s · P_block,s of one replica (units per second of waiting)."""
    return float(np.dot(np.asarray(rep.dag.blocking_w, dtype=float), np.asarray(w, dtype=float)))


def point_cost(se: StrategyEnergy, sp: StrategyPoint, w: Weights) -> PointCost:
    """What one iteration at ``sp`` costs (or emits) under weights ``w`` (module docstring)."""
    return point_costs(se, sp, (w,))[0]


def point_costs(se: StrategyEnergy, sp: StrategyPoint, ws: Sequence[Weights]) -> list[PointCost]:
    """:func:`point_cost` under each of ``ws`` (e.g. money, CO2e and facility kWh of one plan entry); a replica's
    per-stage energies are summed once per distinct DAG and point, whatever the number of replicas and weights."""
    stage_eff: dict[tuple[int, int], np.ndarray] = {}
    out = []
    for w in ws:
        total = 0.0
        for r, (rep, p) in enumerate(zip(se.replicas, sp.points, strict=True)):
            wr = w.per_joule[r]
            u = w.uniform(r)
            if u is not None:
                eff = u * p.effective_j
            else:
                key = (id(rep.dag), id(p))
                if key not in stage_eff:
                    stage_eff[key] = stage_effective_j(rep, [p.choice])[0]
                eff = float(stage_eff[key] @ np.asarray(wr))
            total += eff + blocking_weighted(rep, wr) * sp.time_s
        out.append(PointCost(w.per_second * sp.time_s, total))
    return out



@dataclass(frozen=True)
class CostBounds:
    """Bounds on one strategy's best point under weights, before any frontier is traced (:func:`cost_bounds`):
    ``floor`` ≤ the score of every point of every frontier of it; ``ceiling`` ≥ the score of its best point (the
    score at its T_min point with every clock at maximum, a point the scan always has); ``energy_floor_j`` ≤ the
    joules of every point (J); ``fastest_s`` ≤ every point's iteration time (s); ``per_second``: what one more
    second of iteration adds at least (rent and every stage's blocking power, weighted; units/s)."""

    floor: float
    ceiling: float
    energy_floor_j: float
    fastest_s: float
    per_second: float = 0.0

    @property
    def slowest_s(self) -> float:
        """No point slower than this (s) can be the best: at iteration time T a point costs at least ``floor`` +
        ``per_second`` · (T − ``fastest_s``), above ``ceiling`` beyond it (inf where nothing is paid per second)."""
        if self.per_second <= 0:
            return float("inf")
        return self.fastest_s + max(0.0, self.ceiling - self.floor) / self.per_second


def cost_bounds(dags: Sequence[ReplicaDag], w: Weights, fastest_s: float) -> CostBounds:
    """The bounds of a strategy (module docstring's terms): the floor has the rent and blocking power over its
    fastest iteration time and every stage at its least effective energy (:func:`least_stage_effective_j`); the
    ceiling the same time with every stage at its all-max effective energy.

    Args:
        dags: each data-parallel replica's DAG (on the true, unweighted model).
        w: the strategy's weights.
        fastest_s: its T_min point's iteration time (s): no point of it is faster.

    Returns:
        The bounds (the weights' units per iteration; J; s)."""
    per_dag: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # data-parallel copies share one DAG
    floor = ceiling = w.per_second * fastest_s
    joules = rate = 0.0
    for r, built in enumerate(dags):
        if id(built) not in per_dag:
            at_max = built.table.effective_j[np.arange(len(built.dag.nodes)), built.all_max_choice]
            per_dag[id(built)] = (least_stage_effective_j(built), np.bincount(
                built.dag.node_stage, weights=at_max, minlength=built.dag.num_stages))
        least, most = per_dag[id(built)]
        wr = np.asarray(w.per_joule[r], dtype=float)
        block = np.asarray(built.dag.blocking_w, dtype=float)
        floor += float(least @ wr) + float(block @ wr) * fastest_s
        ceiling += float(most @ wr) + float(block @ wr) * fastest_s
        joules += float(least.sum()) + float(block.sum()) * fastest_s
        rate += float(block @ wr)
    return CostBounds(floor, ceiling, joules, fastest_s, w.per_second + rate)


def least_stage_effective_j(built: ReplicaDag) -> np.ndarray:
    """Per device stage of one replica, the least effective energy any clock plan can give it (J): every
    computation at its option of least effective energy (energy − blocking power × time); transfers add 0."""
    table, dag = built.table, built.dag
    least = np.where(np.isfinite(table.time_s), table.effective_j, np.inf).min(axis=1)
    return np.bincount(dag.node_stage, weights=least, minlength=dag.num_stages)
