"""What :func:`~ampe.energy.strategy.plan_clocks` is asked about one strategy (:class:`ClockRequest`), and what one
replica's realized frontier depends on (:class:`FrontierKey`, the key of :class:`~ampe.energy.strategy.FrontierCache`).

Both are frozen and hashable. The request carries every knob of a call, the periodic fold's threshold
(``fold_from``, :data:`~ampe.tradeoff.periodic.FOLD_FROM` by default) and the min cut's switch to scipy
(``py_max_entries``, :data:`~ampe.tradeoff.mincut.PY_MAX_ENTRIES`) included, so a test or a benchmark sets a knob for
one call instead of patching a module global.
"""

from __future__ import annotations

from dataclasses import dataclass

from ampe.energy import budget
from ampe.tradeoff.mincut import PY_MAX_ENTRIES
from ampe.tradeoff.periodic import FOLD_FROM

PLANNERS = ("perseus", "envpipe", "global")


@dataclass(frozen=True)
class ClockRequest:
    """One strategy's clock-planning question (times in s).

    ``planner``: one of :data:`PLANNERS`. ``unit_s``: τ (None: T_min / 1000, T_min the slowest replica's all-max
    pipeline time; when screening, at least T_min / 200). ``straggler``: the synchronous pipeline time is this
    factor (≥ 1) × T_min. ``max_time_s``: only the part of the frontiers an iteration of at most this many seconds
    can use is realized (None: up to the straggler time, enough for the T_min point). ``screen``: a cheaper pass
    (coarse τ, no fill between PD's fastest point and the all-max time) to rank many strategies. ``margin``: plan as
    if every slowed computation took (1 + margin) × its modelled time, 0..1. ``fastest_only``: only the T' point and
    all-max, no frontier (the time objective). ``coarsening``: the default τ times this factor,
    1..:data:`~ampe.energy.budget.MAX_COARSENING` (an explicit ``unit_s`` is kept as given). ``weights[r][s]``:
    what a joule on device stage s of replica r costs (cost and carbon objectives; None: joules). ``fold_from``: the
    fewest computations whose LP folds a repeating 1F1B middle (:func:`~ampe.tradeoff.periodic.periodic_fold`).
    ``py_max_entries``: the largest min-cut network (residual entries) a frontier trace solves with the pure-Python
    max flow, larger ones going to scipy (:mod:`ampe.tradeoff.mincut`); speed only: the frontier is the same either
    way, so it is not part of :class:`FrontierKey`.
    ``traced``: False solves a frontier's points only directly (at T' and the :attr:`direct` deadlines up to
    ``max_time_s``), no trace (the priced objectives' direct path: docs/energy.md §10.9). ``window_s``: then, the end
    of the strategy's cost window (iteration time, s; None: not known, taken as unbounded); where ``max_time_s`` ends
    before it (the slowdown bound cuts the window) a point is also solved at ``max_time_s``.
    """

    planner: str = "perseus"
    unit_s: float | None = None
    straggler: float = 1.0
    max_time_s: float | None = None
    screen: bool = False
    margin: float = 0.0
    fastest_only: bool = False
    coarsening: float = 1.0
    weights: tuple[tuple[float, ...], ...] | None = None
    fold_from: int = FOLD_FROM
    py_max_entries: int = PY_MAX_ENTRIES
    traced: bool = True
    window_s: float | None = None

    def __post_init__(self) -> None:
        if self.planner not in PLANNERS:
            raise ValueError(f"unknown energy planner {self.planner!r}; one of {', '.join(PLANNERS)}")
        if not self.straggler >= 1.0:
            raise ValueError(f"straggler factor must be ≥ 1, got {self.straggler}")
        if not (1.0 <= self.coarsening <= budget.MAX_COARSENING and 0.0 <= self.margin <= 1.0):
            raise ValueError(f"coarsening must be 1..{budget.MAX_COARSENING:g} and margin 0..1, got "
                             f"{self.coarsening}, {self.margin}")
        if not self.traced and not self.direct:  # the direct path has no points to solve there: it would not apply
            raise ValueError("traced=False needs the perseus planner at full resolution (not screen, not fastest_only)")
        if self.weights is not None and not isinstance(self.weights, tuple):  # a list of lists, an array: hashable
            object.__setattr__(self, "weights", tuple(tuple(float(x) for x in row) for row in self.weights))

    def unit(self, t_min_s: float, resolution: int) -> float:
        """τ (s) for a strategy whose slowest replica's all-max pipeline takes ``t_min_s``: T_min / ``resolution``
        × coarsening, or ``unit_s`` (when screening, at least that coarse τ)."""
        coarse = t_min_s / resolution * self.coarsening
        return coarse if self.unit_s is None else (max(self.unit_s, coarse) if self.screen else self.unit_s)

    def highest_s(self, t_min_s: float, post_s: float) -> float:
        """The longest pipeline time (s) a point is realized for: T' = straggler · T_min, or up to ``max_time_s``
        less the post-pipeline phase ``post_s`` when that is later."""
        t_prime = self.straggler * t_min_s
        return t_prime if self.max_time_s is None else max(t_prime, self.max_time_s - post_s)

    @property
    def solves_lp(self) -> bool:
        """Whether a replica's plan comes from an LP (perseus, the T' point), so depends on the replicas solved
        before it (warm starts)."""
        return self.planner == "perseus" and (self.fastest_only or not self.screen)

    @property
    def direct(self) -> bool:
        """Whether points inside the bound are also solved directly (perseus at full resolution, a frontier)."""
        return self.planner == "perseus" and not self.screen and not self.fastest_only


@dataclass(frozen=True)
class FrontierKey:
    """What one replica's realized frontier depends on, beyond how far it is realized (the cache keeps the farthest
    limit): its inputs, the planner, τ (s), T' (s), the points solved directly (s), the LP's warm starts (the
    distinct replicas of the strategy solved before it) and the request's flags."""

    inputs: tuple
    planner: str
    unit_s: float
    screen: bool
    margin: float
    fastest_only: bool
    t_prime_s: float
    before: tuple
    direct_s: tuple[float, ...]
    fold_from: int
    traced: bool = True

