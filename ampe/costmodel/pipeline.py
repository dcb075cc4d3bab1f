"""Pipeline iteration time: AMP's Eq. 5 closed form and an event-driven simulation of the schedule DAG.

Eq. 5 (fast path, one pipeline)::

    T = (gas − 1) · max_j t_j + Σ_j t_j + Σ_j (e_j^fwd + e_j^bwd)

with t_j = forward + backward of one micro-batch on stage j and e_j the activation (forward) and gradient (backward)
transfers across boundary j. AMP charges one transfer per cut; ampe charges both directions, which is what the
fill-and-drain path really crosses.

The simulation runs the per-stage instruction order of the schedule (DeepSpeed ``TrainSchedule`` for 1F1B,
all-forwards-then-all-backwards for GPipe, Megatron's interleaved 1F1B for virtual stages;
:mod:`ampe.costmodel.schedules`, which the energy DAG uses too) as a DAG: an op starts when
its stage is free and its input has arrived; transfers are asynchronous (the sender keeps computing, as AMP App. 6.1
assumes) but each direction of a link carries one message at a time. Where they differ, see docs/cost_model.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ampe.costmodel.schedules import FORWARD, ScheduleStep, schedule_order
from ampe.errors import InputError

# Operations (forwards and backwards of every pipeline position) one simulation may step through: each costs a few
# microseconds of Python, so 2**18 is about 1-5 s; 1,024 micro-batches over 64 stages is 131,072. Checked before
# anything is allocated (a global batch of 2**22 at pp 4 would be 33 million: minutes and gigabytes).
MAX_SIMULATED_OPS = 1 << 18


def check_simulation(positions: int, gas: int, shared: bool = False) -> None:
    """Refuse a simulation of ``positions`` pipeline positions (all replicas) over ``gas`` micro-batches beyond
    :data:`MAX_SIMULATED_OPS`, with one line naming ``--method`` (``shared``: the time-sharing simulation of ranks
    on shared processors, which every method runs; it names ``--global-batch``)."""
    ops = 2 * positions * gas
    if ops > MAX_SIMULATED_OPS:
        what = "ranks sharing processors are simulated: " if shared else ""
        fix = "a larger micro-batch" if shared else "--method eq5, a larger micro-batch"
        raise InputError("--global-batch" if shared else "--method", "" if shared else "simulate",
                         f"{what}{gas:,} micro-batches over {positions:,} pipeline positions are {ops:,} operations "
                         f"to simulate; at most {MAX_SIMULATED_OPS:,} (use {fix} or a smaller global batch)")


def eq5(stage_s: Sequence[float] | np.ndarray, transfer_s: Sequence[float] | np.ndarray, gas: int) -> float:
    """AMP Eq. 5: ``(gas−1)·max t + Σ t + Σ e`` seconds (``transfer_s`` already holds both directions)."""
    t = np.asarray(stage_s, dtype=float)
    return float((gas - 1) * t.max() + t.sum() + float(np.sum(transfer_s)))


@dataclass(frozen=True)
class ScheduleTimeline:
    """Start/end seconds of every op of every stage, and the makespan."""

    makespan_s: float
    ops: tuple[tuple[ScheduleStep, ...], ...]  # [stage] in execution order
    start_s: tuple[tuple[float, ...], ...]
    end_s: tuple[tuple[float, ...], ...]

    def busy_s(self) -> np.ndarray:
        """Seconds each stage spends computing."""
        return np.array([sum(e - s for s, e in zip(ss, es, strict=True))
                         for ss, es in zip(self.start_s, self.end_s, strict=True)])


def simulate(
    fwd_s: Sequence[float],
    bwd_s: Sequence[float],
    p2p_fwd_s: Sequence[float],
    p2p_bwd_s: Sequence[float],
    gas: int,
    schedule: str = "1f1b",
    virtual_stages: int = 1,
) -> ScheduleTimeline:
    """Event-driven simulation of one iteration of one pipeline.

    ``fwd_s``/``bwd_s`` are per *pipeline position* (pp·v of them: position = chunk·pp + device stage), seconds per
    micro-batch; ``p2p_*_s`` per boundary between consecutive positions (pp·v − 1 of them)."""
    n_pos = len(fwd_s)
    check_simulation(n_pos, gas)
    v = virtual_stages if schedule == "interleaved" else 1
    pp = n_pos // v
    orders = [schedule_order(schedule, s, pp, gas, v) for s in range(pp)]
    done_f = np.full((n_pos, gas), np.nan)  # end time of forward of (position, microbatch)
    done_b = np.full((n_pos, gas), np.nan)
    link_f = np.zeros(max(n_pos - 1, 0))  # time each link direction is free again
    link_b = np.zeros(max(n_pos - 1, 0))
    arrive_f = np.full((n_pos, gas), np.nan)  # when position's input activation arrives
    arrive_b = np.full((n_pos, gas), np.nan)  # when position's output gradient arrives
    arrive_f[0, :] = 0.0
    arrive_b[n_pos - 1, :] = np.inf  # set once the last position's forward is done
    cursor = [0] * pp
    free = [0.0] * pp
    starts: list[list[float]] = [[] for _ in range(pp)]
    ends: list[list[float]] = [[] for _ in range(pp)]
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(pp):
            while cursor[s] < len(orders[s]):
                op = orders[s][cursor[s]]
                pos = op.chunk * pp + s
                m = op.microbatch
                if op.instruction == FORWARD:
                    ready = arrive_f[pos, m]
                else:
                    ready = done_f[pos, m] if pos == n_pos - 1 else arrive_b[pos, m]
                if np.isnan(ready):
                    break
                start = max(free[s], ready)
                dur = fwd_s[pos] if op.instruction == FORWARD else bwd_s[pos]
                end = start + dur
                free[s] = end
                starts[s].append(start)
                ends[s].append(end)
                if op.instruction == FORWARD:
                    done_f[pos, m] = end
                    if pos < n_pos - 1:
                        t0 = max(end, link_f[pos])
                        link_f[pos] = t0 + p2p_fwd_s[pos]
                        arrive_f[pos + 1, m] = link_f[pos]
                else:
                    done_b[pos, m] = end
                    if pos > 0:
                        t0 = max(end, link_b[pos - 1])
                        link_b[pos - 1] = t0 + p2p_bwd_s[pos - 1]
                        arrive_b[pos - 1, m] = link_b[pos - 1]
                cursor[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked (inconsistent op order)")
    makespan = max((e[-1] for e in ends if e), default=0.0)
    return ScheduleTimeline(makespan, tuple(tuple(o) for o in orders), tuple(tuple(x) for x in starts),
                    tuple(tuple(x) for x in ends))


def simulate_shared(
    fwd_s: np.ndarray,
    bwd_s: np.ndarray,
    p2p_fwd_s: np.ndarray,
    p2p_bwd_s: np.ndarray,
    gas: int,
    processors: Sequence[Sequence[Sequence[int]]],
    schedule: str = "1f1b",
    efficiency: Sequence[float] | None = None,
) -> float:
    """Makespan (seconds) of one iteration of every data-parallel replica together, when devices time-share
    processors (CPU emulation: more trial ranks than cores).

    ``fwd_s``/``bwd_s`` are (dp, pp) seconds per micro-batch at a whole processor's speed, ``p2p_*_s`` (dp, pp − 1);
    ``processors[r][j]`` lists the processor of each tensor-parallel shard of replica r's stage j. Each processor is
    shared equally among the computations running on it at the moment (processor sharing, as an OS scheduler does
    for CPU-bound processes), and a stage's shards advance at the pace of the most contended one. ``efficiency[p]``
    (default 1) is the throughput processor p keeps while it is shared: n > 1 computations on it each run at
    efficiency[p]/n of its speed; a lone one runs at full speed. Otherwise as :func:`simulate`: the schedule's
    per-stage order, asynchronous transfers, one message at a time per link."""
    dp, pp = fwd_s.shape
    check_simulation(dp * pp, gas, shared=True)
    orders = [schedule_order(schedule, j, pp, gas) for j in range(pp)]
    tasks = [(r, j) for r in range(dp) for j in range(pp)]
    cursor = {t: 0 for t in tasks}
    left: dict[tuple[int, int], float] = {}  # task → remaining full-speed seconds of its running op
    nan = float("nan")
    arrive_f = np.full((dp, pp, gas), nan)
    arrive_b = np.full((dp, pp, gas), nan)
    done_f = np.full((dp, pp, gas), nan)
    arrive_f[:, 0, :] = 0.0
    link_f = np.zeros((dp, max(pp - 1, 0)))
    link_b = np.zeros((dp, max(pp - 1, 0)))
    now = 0.0
    remaining = len(tasks) * 2 * gas

    def ready_at(task: tuple[int, int]) -> float:
        r, j = task
        op = orders[j][cursor[task]]
        if op.instruction == FORWARD:
            return arrive_f[r, j, op.microbatch]
        return done_f[r, j, op.microbatch] if j == pp - 1 else arrive_b[r, j, op.microbatch]

    def finish(task: tuple[int, int]) -> None:
        nonlocal remaining
        r, j = task
        op = orders[j][cursor[task]]
        m = op.microbatch
        if op.instruction == FORWARD:
            done_f[r, j, m] = now
            if j < pp - 1:
                link_f[r, j] = max(now, link_f[r, j]) + p2p_fwd_s[r, j]
                arrive_f[r, j + 1, m] = link_f[r, j]
        elif j > 0:
            link_b[r, j - 1] = max(now, link_b[r, j - 1]) + p2p_bwd_s[r, j - 1]
            arrive_b[r, j - 1, m] = link_b[r, j - 1]
        cursor[task] += 1
        remaining -= 1
        del left[task]

    while remaining:
        for task in tasks:  # start every op that is ready (zero-length ops finish at once)
            while task not in left and cursor[task] < len(orders[task[1]]) and ready_at(task) <= now:
                r, j = task
                op = orders[j][cursor[task]]
                left[task] = float(fwd_s[r, j] if op.instruction == FORWARD else bwd_s[r, j])
                if left[task] <= 0.0:
                    finish(task)
        if not remaining:
            break
        load: dict[int, int] = {}
        for (r, j) in left:
            for p in processors[r][j]:
                load[p] = load.get(p, 0) + 1
        share = {p: 1.0 if n == 1 else (1.0 if efficiency is None else efficiency[p]) / n for p, n in load.items()}
        rate = {t: min(share[p] for p in processors[t[0]][t[1]]) for t in left}
        step = min((left[t] / rate[t] for t in left), default=float("inf"))
        waits = [ready_at(t) for t in tasks if t not in left and cursor[t] < len(orders[t[1]])]
        upcoming = min((w for w in waits if w == w and w > now), default=float("inf"))
        step = min(step, upcoming - now)
        if step == float("inf"):
            raise RuntimeError("shared-processor pipeline deadlocked (inconsistent op order)")
        now += step
        for t in list(left):
            left[t] -= rate[t] * step
            if left[t] <= 1e-12:
                finish(t)
    return now


def instruction_overhead_s(pipeline_op_s: float, positions: int) -> float:
    """Seconds a device adds to each forward or backward instruction of a pipeline stage (``GpuType.pipeline_op_s``;
    none without a pipeline)."""
    return pipeline_op_s if positions > 1 else 0.0


def shared_iteration_s(fwd_s: np.ndarray, bwd_s: np.ndarray, p2p_fwd_s: np.ndarray, p2p_bwd_s: np.ndarray, gas: int,
                       processors: Sequence[Sequence[Sequence[int]]], schedule: str,
                       efficiency: Sequence[float] | None, sync_s: np.ndarray, optimizer_s: np.ndarray) -> float:
    """Iteration seconds when devices time-share processors (cluster ``processors:``): every replica's pipeline
    simulated together with each processor shared among the computations on it (:func:`simulate_shared`, at the
    node's ``efficiency``), then the tail — per processor, the slowest gradient all-reduce of its ranks
    (``sync_s[stage]``) and their optimizer steps (``optimizer_s[stage]``) together. ``processors[r][j]``: the
    processor of each tensor-parallel rank of replica r's stage j."""
    makespan = simulate_shared(fwd_s, bwd_s, p2p_fwd_s, p2p_bwd_s, gas, processors, schedule, efficiency)
    steps: dict[int, float] = {}
    ranks: dict[int, int] = {}
    comm: dict[int, float] = {}
    for replica in processors:
        for j, stage in enumerate(replica):
            for p in stage:
                steps[p] = steps.get(p, 0.0) + float(optimizer_s[j])
                ranks[p] = ranks.get(p, 0) + 1
                comm[p] = max(comm.get(p, 0.0), float(sync_s[j]))
    # Optimizer steps of ranks sharing a processor overlap, so they run at its shared efficiency.
    return makespan + max(steps[p] / (efficiency[p] if efficiency is not None and ranks[p] > 1 else 1.0) + comm[p]
                          for p in steps)
