"""How much work energy planning will be, estimated before it starts, and what is done beyond the bound
(docs/energy.md §10.8).

The unit is a **node-step**: one DAG node handled in one Phillips–Dessouky step of a frontier trace. Measured on two
shared CPU cores (``benchmarks/energy_scale.py``; 4 × 32 V100, 8 × 64 A100, 8 × 96 T4 pipelines; llama-3.1-8b
strategies on mixed-h100-a100): a PD step costs 0.8–3.5 × 10⁻⁷ s per node, so :data:`SECONDS_PER_STEP` = 3 × 10⁻⁷ s.
Per strategy:

* its T_min point (DAG, option table, all-max pass): :data:`BUILD_STEPS` per node (≈ 9 µs per node measured);
* a frontier (Perseus): (nodes + 25) × 1.2 × steps (realizing the points: the 0.2; a step's own bookkeeping: the
  25, ≈ 8 µs measured on a 2-node DAG), steps = 1.25 × R × (ρ − 1) + 1, where
  τ = T_min / R (R = 1000 for the plans, 200 when screening) and ρ the largest ratio, over the strategy's GPU types,
  of the time at the clock of least effective energy to the time at f_max (T* ≤ ρ · T_min; ρ = 6.2 for an A100,
  2.6 for a V100, 1.4 for a T4); the 1.25 covers the rounding of quantized times (A100 pipelines took 4 500–5 200
  steps for 1000 × 5.2, a T4 one 515 for 1000 × 0.4);
* the point solved directly (``point_by``, the LP): nodes × 300 × max(1, nodes / 3000)^0.75 (HiGHS grows faster than
  linearly: 1.0 s at 5 760 nodes, 8.8 s at 23 808, 107 s at 96 768);
* the baselines: EnvPipe nodes × 2000, one global clock nodes × 25 × clocks.

Bounds (decision): the frontier part may take :data:`FRONTIER_BOUND` node-steps (≈ 3 minutes; a caller may give
another: ``rank_strategies(frontier_bound=…)``); beyond it every
frontier's τ is made coarser by the factor that fits, up to :data:`MAX_COARSENING` (τ = T_min / 100 for the plans,
T_min / 20 when screening), and one line says so. GPT-3 175B at 32 × 768 (5 × 10⁸ node-steps, the largest planned
case) runs unchanged. Beyond 10× coarser, or when everything together exceeds :data:`TOTAL_BOUND` (≈ 1 hour),
planning is refused before it starts, naming the flag that drives the work. One strategy's DAG may have at most
:data:`MAX_DAG_NODES` nodes (memory grows linearly: 1.4 GB at 96 768 nodes; a caller may give another bound:
``rank_strategies(max_dag_nodes=…)``); ``ampe search`` plans the others and lists such a strategy unplanned
(:func:`ampe.planning.dag_bounded`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ampe.errors import InputError

SECONDS_PER_STEP = 3e-7  # CPU seconds per node-step on the 2 shared cores of the development machines
BUILD_STEPS = 30  # DAG + option table + all-max pass, per node
FRONTIER_BOUND = 6e8  # node-steps of frontier tracing before τ is coarsened (≈ 3 min)
TOTAL_BOUND = 1.2e10  # node-steps of everything before planning is refused (≈ 1 h)
MAX_COARSENING = 10.0  # τ at most 10× the default (T_min/100 for plans, T_min/20 when screening)
MAX_DAG_NODES = 200_000  # one pipeline's DAG (≈ 3 GB; 32 × 768 has 96 768)
QUANTIZATION = 1.25  # frontier steps per unit of (ρ − 1) · R, for the rounding of quantized times
REALIZING = 1.2  # tracing plus realizing the points, per traced node-step
STEP_OVERHEAD = 25  # node-steps of a PD step's own bookkeeping, whatever the DAG (≈ 8 µs; 2-node DAGs)
ENVPIPE_STEPS = 2000
GLOBAL_STEPS_PER_CLOCK = 25


def dag_nodes(pp: int, gas: int, virtual_stages: int = 1, transfers: bool = True) -> int:
    """Nodes of one pipeline's DAG: a forward and a backward per micro-batch and virtual stage, and (``transfers``)
    an activation and a gradient transfer per micro-batch across each of the pp·v − 1 boundaries."""
    v = pp * virtual_stages
    return 2 * v * gas + (2 * (v - 1) * gas if transfers else 0)


@lru_cache(maxsize=64)
def slowdown_ratio(gpu: Any) -> float:
    """ρ of one GPU type: time at its clock of least effective energy over time at f_max (DVFS model)."""
    from ampe.energy import dvfs
    from ampe.energy.model_options import model_options

    options = model_options(gpu, 1.0, 1)
    fastest = min(o.time_s for o in options.options)
    return max(1.0, options.min_energy(dvfs.blocking_power_w(gpu)).time_s / fastest) if fastest > 0 else 1.0


def frontier_steps(ratio: float, resolution: float) -> float:
    """Expected PD steps of a frontier at τ = T_min / ``resolution`` for a pipeline whose T* ≤ ``ratio`` · T_min."""
    return QUANTIZATION * resolution * max(0.0, ratio - 1.0) + 1.0


def lp_steps(nodes: int) -> float:
    """Node-steps of the point solved directly (HiGHS; superlinear in the nodes)."""
    return nodes * 300.0 * max(1.0, nodes / 3000.0) ** 0.75


@dataclass(frozen=True)
class Job:
    """One strategy's share of the planning: its distinct DAGs' nodes, ρ, clocks per computation, T_min (s), and
    the computations of its largest DAG (no transfers)."""

    index: int
    nodes: int
    ratio: float
    clocks: int
    t_min_s: float
    label: str
    computations: int = 0


@dataclass(frozen=True)
class Work:
    """Estimated node-steps: ``fixed`` (T_min points, LPs, baselines; τ changes nothing) and ``frontier`` (PD and
    realizing, inversely proportional to the coarsening of τ)."""

    fixed: float
    frontier: float
    strategies: int

    def at(self, coarsening: float) -> float:
        """All node-steps with τ ``coarsening`` times the default."""
        return self.fixed + self.frontier / coarsening

    @staticmethod
    def seconds(steps: float) -> float:
        """CPU seconds of ``steps`` node-steps (2 shared cores)."""
        return steps * SECONDS_PER_STEP


def duration(steps: float) -> str:
    """``steps`` node-steps as CPU time in words: ``40 s``, ``4.3 min``, ``2.1 h``, ``3.5e+06 h``."""
    s = Work.seconds(steps)
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.2g} h"


def frontier_work(job: Job, planner: str, resolution: float | None, unit_s: float | None) -> tuple[float, float]:
    """(fixed, frontier) node-steps of one strategy's clock plans: τ = T_min / ``resolution``, or ``unit_s``."""
    if planner == "envpipe":
        return job.nodes * ENVPIPE_STEPS, 0.0
    if planner == "global":
        return job.nodes * GLOBAL_STEPS_PER_CLOCK * job.clocks, 0.0
    res = job.t_min_s / unit_s if unit_s else (resolution or 1000.0)
    return 0.0, REALIZING * (job.nodes + STEP_OVERHEAD) * frontier_steps(job.ratio, res)


EXACT_TRACE_S = 1.0  # CPU s: a priced strategy whose trace is estimated at most this keeps it (docs/energy.md §10.9)
EXACT_TRACE_STEPS = EXACT_TRACE_S / SECONDS_PER_STEP


def trace_is_cheap(job: Job, unit_s: float | None, coarsening: float = 1.0, resolution: float = 1000.0) -> bool:
    """Whether strategy ``job``'s frontier trace (Perseus, τ = T_min / ``resolution`` × ``coarsening``, or
    ``unit_s``) is estimated at no more than :data:`EXACT_TRACE_STEPS` node-steps (:data:`EXACT_TRACE_S` CPU s).

    Why (the priced objectives' default path, docs/energy.md §10.9): the trace is exact and the points solved
    directly are not (the LP's greedy repair is 0.006–0.015 % dearer at the same deadline on the bundled priced
    spec), so a strategy keeps its trace where it costs no more than the command's own start-up (about 1 s of
    imports); past that the trace is what the user waits for (tens of seconds a strategy at 1,024 GPUs) and the
    direct points keep the priced search within 1.5× of the time objective."""
    _, trace = frontier_work(job, "perseus", resolution, unit_s)
    return trace / (1.0 if unit_s else coarsening) <= EXACT_TRACE_STEPS


@dataclass(frozen=True)
class Decision:
    """What the planning will do: τ ``coarsening`` × the default (1: unchanged), the estimate, and the line that
    says so (None when nothing was changed)."""

    coarsening: float
    work: Work
    note: str | None


def decide(work: Work, flag: str, what: str, user_unit: bool, frontier_bound: float = FRONTIER_BOUND) -> Decision:
    """Apply the bounds to ``work``. ``flag``/``what`` name what drives it in a refusal (``--max-slowdown``, "130
    strategies within 500 % of the fastest"); ``user_unit``: τ was given (``--unit-time``), so it is never changed;
    ``frontier_bound``: the node-steps of frontier tracing before τ is coarsened. Raises :class:`InputError`."""
    total = work.at(1.0)
    if total > TOTAL_BOUND and work.fixed > TOTAL_BOUND:
        raise InputError(flag, "", f"{what}: about {duration(total)} of energy planning estimated ({total:.2g} "
                         f"node-steps; at most {TOTAL_BOUND:.2g}, ≈ {duration(TOTAL_BOUND)}): narrow the search "
                         "(--pp, --top-k) or use --energy-planner none")
    if work.frontier <= frontier_bound and total <= TOTAL_BOUND:
        return Decision(1.0, work, None)
    if user_unit:
        raise InputError("--unit-time", "", f"{what}: about {duration(work.frontier)} of frontier tracing at this "
                         f"unit time ({work.frontier:.2g} node-steps; at most {frontier_bound:.2g}): give a coarser "
                         "--unit-time or leave it out (then τ is coarsened to fit)")
    k = max(work.frontier / frontier_bound, (work.frontier / max(TOTAL_BOUND - work.fixed, 1.0)))
    k = math.ceil(k * 10) / 10
    if k > MAX_COARSENING:
        raise InputError(flag, "", f"{what}: about {duration(total)} of energy planning estimated ({total:.2g} "
                         f"node-steps), over the bound even with a {MAX_COARSENING:g}× coarser unit time: narrow it "
                         "(or --pp, --top-k), or use --objective time")
    return Decision(k, work, f"energy planning: {what} would take about {duration(total)} (over the bound of "
                    f"{duration(frontier_bound)} of frontier tracing); planning with a {k:g}× coarser unit time "
                    f"(τ = T_min/{1000 / k:.0f} instead of T_min/1000; screening T_min/{200 / k:.0f}), about "
                    f"{duration(work.at(k))}")


def check_nodes(jobs: Sequence[Job], where: str, max_nodes: int = MAX_DAG_NODES) -> None:
    """Refuse the largest of ``jobs`` when its DAGs have more than ``max_nodes`` nodes (InputError; ``where`` names
    the input in the message): called before any of them is built."""
    big = max(jobs, key=lambda j: j.nodes, default=None)
    if big is not None and big.nodes > max_nodes:
        raise InputError(where, "", f"{big.label}: its energy-planning DAG has {big.nodes} nodes (at most "
                         f"{max_nodes}; memory grows about 15 kB per node): fewer micro-batches (a larger "
                         "micro-batch size or a smaller --global-batch), fewer stages (--pp), or --energy-planner "
                         "none")


TRACE_BOUND = FRONTIER_BOUND * MAX_COARSENING  # one frontier traced on request (`ampe frontier`): ≈ 30 min


def options_ratio(options: Any, blocking_w: float) -> float:
    """ρ of one computation's options (:class:`~ampe.tradeoff.options.OpOptions`): the time at its option of least
    effective energy over its fastest time (1 for a constant)."""
    fastest = min(o.time_s for o in options.options)
    return max(1.0, options.min_energy(blocking_w).time_s / fastest) if fastest > 0 else 1.0


REALIZE_STEPS = 2.5  # node-steps of realizing one planned point (mapping, polish), per DAG node: 7.7 CPU s for
# 52,745 points of 192 nodes (`ampe frontier --profile gpt3-175b+a40_bf16.csv --stages 8 --microbatches 12
# --unit-time 3e-5 --resolution 0`)
REALIZE_BOUND = FRONTIER_BOUND  # realizing the points of one frontier on request (≈ 3 min)


def check_realize(nodes: int, planned: int, realized: int | None) -> float:
    """Node-steps of realizing a traced frontier's ``planned`` points (one per unit step), or at most ``realized``
    of them (None: every one, ``--resolution 0``); refused (InputError naming ``--resolution``) beyond
    REALIZE_BOUND, with the resolution that would fit."""
    points = planned if realized is None else min(planned, realized)
    work = REALIZE_STEPS * (nodes + STEP_OVERHEAD) * points
    if work > REALIZE_BOUND:
        fits = max(1, int(REALIZE_BOUND / (REALIZE_STEPS * (nodes + STEP_OVERHEAD))))
        raise InputError("--resolution", "", f"realizing {points} frontier points of {nodes} DAG nodes is about "
                         f"{duration(work)} (at most {duration(REALIZE_BOUND)}): use --resolution {fits} or less, "
                         "or a coarser --unit-time")
    return work


def check_trace(nodes: int, t_min_s: float, ratio: float, unit_s: float, flag: str = "--unit-time") -> float:
    """Node-steps of tracing one whole frontier of ``nodes`` nodes, T_min ``t_min_s`` and ratio ``ratio`` at
    τ = ``unit_s``; refused (InputError naming ``flag``) beyond TRACE_BOUND, with the τ that would fit."""
    work = REALIZING * (nodes + STEP_OVERHEAD) * (QUANTIZATION * max(0.0, ratio - 1.0) * t_min_s / unit_s + 1.0)
    if work > TRACE_BOUND:
        fits = unit_s * work / TRACE_BOUND
        raise InputError(flag, "", f"τ = {unit_s:g} s: tracing this frontier ({nodes} DAG nodes, T_min "
                         f"{t_min_s:.3g} s, T* up to {ratio:.2g}× that) is about {work:.2g} node-steps, "
                         f"≈ {duration(work)} (at most {duration(TRACE_BOUND)}): use --unit-time {fits:.2g} or "
                         "coarser")
    return work
