"""Extrinsic energy bloat: pipelines that wait at the gradient sync for a slower one (Perseus Eq. 2).

Every data-parallel replica has its own frontier. The synchronous iteration time is T' = straggler ·
max_r T_min,r (straggler = 1: the slowest replica alone sets it, e.g. a replica on slower GPUs). Each replica runs
at T_opt,r = min(T*_r, T'): the frontier point with the largest time ≤ T_opt,r; going slower than T* would cost
more energy, going faster only waits longer. Energy of replica r = effective_r + P_block,r · T' (Eq. 3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ampe.tradeoff.evaluate import Evaluation
from ampe.tradeoff.frontier import FrontierPoint


@dataclass(frozen=True)
class PipelineFrontier:
    """One replica's realized frontier (Pareto points sorted by time), waiting power and all-max evaluation."""

    points: tuple[FrontierPoint, ...]
    blocking_w: float  # Σ over stages of the power while waiting (W)
    all_max: Evaluation  # every clock at maximum

    @property
    def t_min_s(self) -> float:
        """Fastest iteration time (s)."""
        return self.points[0].time_s

    @property
    def t_star_s(self) -> float:
        """Iteration time of the minimum-energy point (s)."""
        return self.points[-1].time_s

    def point_at(self, target_s: float) -> FrontierPoint:
        """The cheapest point that is not slower than ``target_s`` (the fastest point if none is)."""
        best = self.points[0]
        for p in self.points:
            if p.time_s <= target_s * (1 + 1e-12):
                best = p
        return best

    def energy_j(self, point_effective_j: float, t_prime_s: float) -> float:
        """Energy of one iteration that computes with ``point_effective_j`` and waits until ``t_prime_s``."""
        return point_effective_j + self.blocking_w * t_prime_s


@dataclass(frozen=True)
class ReplicaPlan:
    """The frontier points chosen for all replicas at synchronous iteration time ``t_prime_s``."""

    t_prime_s: float
    points: tuple[FrontierPoint, ...]
    energy_j: float  # all replicas, one iteration, waiting until T' included
    all_max_energy_j: float  # the same with every clock at maximum

    @property
    def savings(self) -> float:
        """Fraction of energy saved against all clocks at maximum."""
        return 1.0 - self.energy_j / self.all_max_energy_j if self.all_max_energy_j > 0 else 0.0


def plan_replicas(frontiers: Sequence[PipelineFrontier], straggler: float = 1.0) -> ReplicaPlan:
    """Choose every replica's point for T' = ``straggler`` · (slowest replica's T_min)."""
    if not frontiers:
        raise ValueError("need at least one replica")
    if not straggler >= 1.0:
        raise ValueError(f"straggler factor must be ≥ 1, got {straggler}")
    return plan_at(frontiers, straggler * max(f.t_min_s for f in frontiers))


def plan_at(frontiers: Sequence[PipelineFrontier], t_prime_s: float) -> ReplicaPlan:
    """Every replica's point for a given synchronous iteration time ``t_prime_s`` (s, ≥ the slowest T_min): replica
    r runs the cheapest point not slower than min(T*_r, T'). Used to scan T' when trading time for energy."""
    if not frontiers:
        raise ValueError("need at least one replica")
    chosen = tuple(f.point_at(min(f.t_star_s, t_prime_s)) for f in frontiers)
    energy = sum(f.energy_j(p.effective_j, t_prime_s) for f, p in zip(frontiers, chosen, strict=False))
    base = sum(f.energy_j(f.all_max.effective_j, max(t_prime_s, f.all_max.time_s)) for f in frontiers)
    return ReplicaPlan(t_prime_s, chosen, energy, base)
