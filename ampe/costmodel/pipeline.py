"""Pipeline iteration time: Eq. 5-style closed forms and an event-driven simulation of the schedule.

AMP's Eq. 5 (one pipeline)::

    T = (gas − 1) · max_j t_j + Σ_j t_j + Σ_j e_j

with t_j = forward + backward of one micro-batch on stage j and e_j the activation (forward) and gradient (backward)
transfers across boundary j. AMP charges one transfer per cut; ampe charges both directions, which is what the
fill-and-drain path really crosses. AMP assumes the sender keeps computing while its message travels (App. 6.1), so
transfers cost only on the fill-and-drain path.

DeepSpeed's pipeline engine does not overlap them: ``p2p.send``/``p2p.recv`` are ``torch.distributed.send``/``recv``
(NCCL: the compute stream waits for the transfer; gloo: the process does), each matched with its peer's call, and
a stage runs its instructions one after the other. So on 1F1B (the schedule it runs) a transfer holds both stages
it joins, and in the steady state each micro-batch of stage j costs its compute and the transfers of both of its
boundaries (:func:`blocking_eq5`)::

    T = (gas − 1) · max_j (t_j + e_{j−1} + e_j) + Σ_j t_j + Σ_j e_j

which is Eq. 5 where transfers are negligible against the stage time.

The simulation runs each stage's instruction stream: for 1F1B DeepSpeed's ``TrainSchedule`` with its transfers
(:func:`~ampe.costmodel.schedules.deepspeed_instructions`), a transfer starting when both stages have reached it and
holding both for its duration; for GPipe (all forwards, then all backwards) and Megatron's interleaved 1F1B (which
sends with batched ``isend``/``irecv`` beside its compute) the order of :func:`~ampe.costmodel.schedules.schedule_order`
with asynchronous transfers, each direction of a link carrying one message at a time. Where the closed forms and the
simulation differ, see docs/cost_model.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ampe.costmodel.schedules import (
    BACKWARD,
    FORWARD,
    RECV_ACTIVATION,
    RECV_GRAD,
    SEND_ACTIVATION,
    SEND_GRAD,
    ScheduleStep,
    deepspeed_instructions,
    schedule_order,
)
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


def closed_form_s(fwd_s: np.ndarray, bwd_s: np.ndarray, transfer_s: np.ndarray, gas: int, schedule: str,
                  virtual_stages: int = 1) -> float:
    """One pipeline's iteration seconds by the schedule's closed form: :func:`blocking_eq5` where transfers block
    (1F1B), :func:`eq5` otherwise, and for the interleaved schedule Eq. 5 per device with the fill/drain bubble
    shrunk by the chunks per device (Narayanan et al. 2021). ``fwd_s``/``bwd_s`` per position, ``transfer_s`` per
    boundary (both directions), seconds; ``gas``: the pipeline's micro-batches."""
    if schedule == "interleaved" and virtual_stages > 1:
        per_device = (fwd_s + bwd_s).reshape(virtual_stages, -1).sum(axis=0)
        return float(gas * per_device.max() + (per_device.sum() - per_device.max()) / virtual_stages
                     + transfer_s.sum())
    if blocks(schedule, virtual_stages):
        return blocking_eq5(fwd_s + bwd_s, transfer_s, gas)
    return eq5(fwd_s + bwd_s, transfer_s, gas)


def replica_pipelines(fwd_s: np.ndarray, bwd_s: np.ndarray, p2p_s: np.ndarray, p2p_back_s: np.ndarray,
                      grad_sent: Sequence[bool], replica_class: np.ndarray, shares: Sequence[int], schedule: str,
                      virtual_stages: int, method: str) -> list[float]:
    """Each replica's pipeline seconds with its own micro-batches: the closed form (``method`` "eq5") or the
    simulation of its class's stage terms, costed once per (class, share).

    Args:
        fwd_s, bwd_s: (classes, positions) seconds per micro-batch.
        p2p_s, p2p_back_s: (classes, boundaries) one activation, one gradient transfer (0 where none is sent), s.
        grad_sent: [boundary] whether a gradient crosses it.
        replica_class: (dp,) each replica's class.
        shares: [replica] micro-batches.
        schedule, virtual_stages: the strategy's.
        method: "eq5" or "simulate".

    Returns:
        [replica] pipeline seconds.
    """
    runs = list(zip(replica_class.tolist(), shares, strict=True))
    by_run: dict[tuple[int, int], float] = {}
    for c, g in dict.fromkeys(runs):
        if method == "simulate":
            by_run[c, g] = simulate(fwd_s[c], bwd_s[c], p2p_s[c], p2p_back_s[c], g, schedule, virtual_stages,
                                    grad_sent).makespan_s
        else:
            by_run[c, g] = closed_form_s(fwd_s[c], bwd_s[c], p2p_s[c] + p2p_back_s[c], g, schedule, virtual_stages)
    return [float(by_run[r]) for r in runs]


def blocks(schedule: str, virtual_stages: int = 1) -> bool:
    """Whether the schedule's transfers block both stages they join (DeepSpeed's 1F1B engine; module docstring)."""
    return schedule == "1f1b" and virtual_stages == 1


def blocking_eq5(stage_s: Sequence[float] | np.ndarray, transfer_s: Sequence[float] | np.ndarray, gas: int) -> float:
    """Eq. 5 with blocking transfers: ``(gas−1)·max_j (t_j + e_{j−1} + e_j) + Σ t + Σ e`` seconds, ``e_j`` both
    directions of boundary j (module docstring)."""
    t = np.asarray(stage_s, dtype=float)
    e = np.asarray(transfer_s, dtype=float)
    held = t.copy()
    held[:-1] += e
    held[1:] += e
    return float((gas - 1) * held.max() + t.sum() + float(e.sum()))


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
    grad_sent: Sequence[bool] | None = None,
) -> ScheduleTimeline:
    """Event-driven simulation of one iteration of one pipeline (module docstring).

    ``fwd_s``/``bwd_s`` are per *pipeline position* (pp·v of them: position = chunk·pp + device stage), seconds per
    micro-batch; ``p2p_*_s`` per boundary between consecutive positions (pp·v − 1 of them). ``grad_sent``: per
    boundary, whether a gradient crosses it (default all; not after a frozen prefix, where the 1F1B engine's
    ``SendGrad``/``RecvGrad`` do nothing: ``ampe.runtime.freeze``)."""
    n_pos = len(fwd_s)
    check_simulation(n_pos, gas)
    if blocks(schedule, virtual_stages):
        return _simulate_blocking(fwd_s, bwd_s, p2p_fwd_s, p2p_bwd_s, gas, grad_sent)
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


def _simulate_blocking(fwd_s: Sequence[float], bwd_s: Sequence[float], p2p_fwd_s: Sequence[float],
                       p2p_bwd_s: Sequence[float], gas: int, grad_sent: Sequence[bool] | None) -> ScheduleTimeline:
    """:func:`simulate` of DeepSpeed's 1F1B: every stage runs its instruction stream in order; a transfer starts when
    both stages have reached it and holds both for its duration."""
    pp = len(fwd_s)
    streams = [deepspeed_instructions(j, pp, gas) for j in range(pp)]
    cursor = [0] * pp
    free = [0.0] * pp
    ops: list[list[ScheduleStep]] = [[] for _ in range(pp)]
    starts: list[list[float]] = [[] for _ in range(pp)]
    ends: list[list[float]] = [[] for _ in range(pp)]
    remaining = sum(len(x) for x in streams)
    while remaining:
        progressed = False
        for j in range(pp):
            while cursor[j] < len(streams[j]):
                op = streams[j][cursor[j]]
                if op.instruction in (FORWARD, BACKWARD):
                    ops[j].append(op)
                    starts[j].append(free[j])
                    free[j] += fwd_s[j] if op.instruction == FORWARD else bwd_s[j]
                    ends[j].append(free[j])
                    done = [j]
                else:
                    peer, seconds, sent = _transfer(op, j, p2p_fwd_s, p2p_bwd_s, grad_sent)
                    if not sent:
                        done = [j]
                    elif streams[peer][cursor[peer]:cursor[peer] + 1] == [_match(op)]:
                        free[j] = free[peer] = max(free[j], free[peer]) + seconds
                        done = [j, peer]
                    else:
                        break  # the peer has not reached it yet
                for k in done:
                    cursor[k] += 1
                remaining -= len(done)
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked (inconsistent op order)")
    return ScheduleTimeline(max(free), tuple(tuple(o) for o in ops), tuple(tuple(x) for x in starts),
                            tuple(tuple(x) for x in ends))


_PEER = {SEND_ACTIVATION: (1, RECV_ACTIVATION), RECV_ACTIVATION: (-1, SEND_ACTIVATION),
         SEND_GRAD: (-1, RECV_GRAD), RECV_GRAD: (1, SEND_GRAD)}  # transfer → (peer stage offset, peer's instruction)


def _match(op: ScheduleStep) -> ScheduleStep:
    """The peer's instruction that ``op`` (a transfer) meets."""
    return ScheduleStep(_PEER[op.instruction][1], op.microbatch)


def _transfer(op: ScheduleStep, stage: int, p2p_fwd_s: Sequence[float], p2p_bwd_s: Sequence[float],
              grad_sent: Sequence[bool] | None) -> tuple[int, float, bool]:
    """(peer stage, seconds, whether anything is sent) of transfer ``op`` of ``stage``."""
    peer = stage + _PEER[op.instruction][0]
    boundary = min(stage, peer)
    if op.instruction in (SEND_ACTIVATION, RECV_ACTIVATION):
        return peer, float(p2p_fwd_s[boundary]), True
    return peer, float(p2p_bwd_s[boundary]), grad_sent is None or bool(grad_sent[boundary])


def simulate_shared(
    fwd_s: np.ndarray,
    bwd_s: np.ndarray,
    p2p_fwd_s: np.ndarray,
    p2p_bwd_s: np.ndarray,
    gas: int | Sequence[int],
    processors: Sequence[Sequence[Sequence[int]]],
    schedule: str = "1f1b",
    efficiency: Sequence[float] | None = None,
    grad_sent: Sequence[bool] | None = None,
) -> float:
    """Makespan (seconds) of one iteration of every data-parallel replica together, when devices time-share
    processors (CPU emulation: more trial ranks than cores).

    ``fwd_s``/``bwd_s`` are (dp, pp) seconds per micro-batch at a whole processor's speed, ``p2p_*_s`` (dp, pp − 1);
    ``processors[r][j]`` lists the processor of each tensor-parallel shard of replica r's stage j. Each processor is
    shared equally among the computations running on it at the moment (processor sharing, as an OS scheduler does
    for CPU-bound processes), and a stage's shards advance at the pace of the most contended one. ``efficiency[p]``
    (default 1) is the throughput processor p keeps while it is shared: n > 1 computations on it each run at
    efficiency[p]/n of its speed; a lone one runs at full speed. Otherwise as :func:`simulate` (the same instruction
    streams and transfers; a transfer takes no processor time). ``gas``: micro-batches of every replica, or of
    each (uneven shares: ``Strategy.shares``)."""
    dp, pp = fwd_s.shape
    per = [gas] * dp if isinstance(gas, int) else list(gas)
    check_simulation(dp * pp, max(per), shared=True)
    made = {g: [_instruction_stream(schedule, j, pp, g) for j in range(pp)] for g in set(per)}
    run = _SharedRun(fwd_s, bwd_s, p2p_fwd_s, p2p_bwd_s, blocks(schedule), grad_sent, [made[g] for g in per])
    while run.remaining:
        run.start_ready()
        if not run.remaining:
            break
        load: dict[int, int] = {}
        for (r, j) in run.left:
            for p in processors[r][j]:
                load[p] = load.get(p, 0) + 1
        share = {p: 1.0 if n == 1 else (1.0 if efficiency is None else efficiency[p]) / n for p, n in load.items()}
        rate = {t: min(share[p] for p in processors[t[0]][t[1]]) for t in run.left}
        events = [run.now + run.left[t] / rate[t] for t in run.left] + list(run.held.values()) + run.arrivals()
        if not events:
            raise RuntimeError("shared-processor pipeline deadlocked (inconsistent op order)")
        step = min(events) - run.now
        run.now += step
        for t in list(run.left):
            run.left[t] -= rate[t] * step
            if run.left[t] <= 1e-12:
                del run.left[t]
                run.finish(t)
        for t in [t for t, end in run.held.items() if end <= run.now]:
            del run.held[t]
            run.finish(t)
    return run.now


def _instruction_stream(schedule: str, stage: int, pp: int, gas: int) -> list[ScheduleStep]:
    """A stage's computations and transfers in order: DeepSpeed's 1F1B stream, or (asynchronous schedules) each
    computation of :func:`~ampe.costmodel.schedules.schedule_order` between the receipt of its input and the
    sending of its output."""
    if blocks(schedule):
        return deepspeed_instructions(stage, pp, gas)
    out: list[ScheduleStep] = []
    for op in schedule_order(schedule, stage, pp, gas):
        m, forward = op.microbatch, op.instruction == FORWARD
        if stage > 0 if forward else stage < pp - 1:
            out.append(ScheduleStep(RECV_ACTIVATION if forward else RECV_GRAD, m))
        out.append(op)
        if stage < pp - 1 if forward else stage > 0:
            out.append(ScheduleStep(SEND_ACTIVATION if forward else SEND_GRAD, m))
    return out


class _SharedRun:
    """The state of :func:`simulate_shared`: each task (replica, stage) walks its instruction stream; a running
    computation's remaining full-speed seconds (``left``), a blocking transfer's end (``held``), an asynchronous
    message's arrival per (replica, boundary, direction, micro-batch) and each link direction's free time."""

    def __init__(self, fwd_s: np.ndarray, bwd_s: np.ndarray, p2p_fwd_s: np.ndarray, p2p_bwd_s: np.ndarray,
                 blocking: bool, grad_sent: Sequence[bool] | None,
                 streams: list[list[list[ScheduleStep]]]) -> None:
        dp, pp = fwd_s.shape
        self.f, self.b, self.pf, self.pb = fwd_s, bwd_s, p2p_fwd_s, p2p_bwd_s
        self.blocking, self.grad_sent, self.streams = blocking, grad_sent, streams
        self.tasks = [(r, j) for r in range(dp) for j in range(pp)]
        self.cursor = dict.fromkeys(self.tasks, 0)
        self.left: dict[tuple[int, int], float] = {}
        self.held: dict[tuple[int, int], float] = {}
        self.arrive: dict[tuple[int, int, bool, int], float] = {}
        self.link: dict[tuple[int, int, bool], float] = {}
        self.now = 0.0
        self.remaining = sum(len(s) for per_replica in streams for s in per_replica)  # streams[replica][stage]

    def head(self, t: tuple[int, int]) -> ScheduleStep | None:
        """The next instruction of idle task ``t`` (None while it computes, transfers or is done)."""
        if t in self.left or t in self.held or self.cursor[t] >= len(self.streams[t[0]][t[1]]):
            return None
        return self.streams[t[0]][t[1]][self.cursor[t]]

    def finish(self, t: tuple[int, int]) -> None:
        """Task ``t``'s current instruction is done."""
        self.cursor[t] += 1
        self.remaining -= 1

    def start_ready(self) -> None:
        """Start, at ``now``, everything that can start (zero-length work finishes at once)."""
        changed = True
        while changed:
            changed = False
            for t in self.tasks:
                while (op := self.head(t)) is not None and self._step(t, op):
                    changed = True

    def _step(self, t: tuple[int, int], op: ScheduleStep) -> bool:
        """Start or do ``op`` of idle task ``t``; False when it must wait."""
        r, j = t
        if op.instruction in (FORWARD, BACKWARD):
            seconds = float((self.f if op.instruction == FORWARD else self.b)[r, j])
            if seconds > 0:
                self.left[t] = seconds
            else:
                self.finish(t)
            return True
        forward = op.instruction in (SEND_ACTIVATION, RECV_ACTIVATION)
        peer, seconds, sent = _transfer(op, j, self.pf[r], self.pb[r], self.grad_sent if self.blocking else None)
        if self.blocking:
            if not sent:
                self.finish(t)
                return True
            if self.head((r, peer)) != _match(op):
                return False
            if seconds > 0:
                self.held[t] = self.held[(r, peer)] = self.now + seconds
            else:
                self.finish(t)
                self.finish((r, peer))
            return True
        key = (r, min(j, peer), forward)
        if op.instruction in (SEND_ACTIVATION, SEND_GRAD):  # posted: the sender goes on
            self.link[key] = max(self.now, self.link.get(key, 0.0)) + seconds
            self.arrive[(*key, op.microbatch)] = self.link[key]
            self.finish(t)
            return True
        if self.arrive.get((*key, op.microbatch), np.inf) <= self.now:
            self.finish(t)
            return True
        return False

    def arrivals(self) -> list[float]:
        """Arrival times after ``now`` that an idle task waits for."""
        out = []
        for t in self.tasks:
            op = self.head(t)
            if op is not None and op.instruction in (RECV_ACTIVATION, RECV_GRAD) and not self.blocking:
                peer = t[1] + _PEER[op.instruction][0]
                key = (t[0], min(t[1], peer), op.instruction == RECV_ACTIVATION, op.microbatch)
                if self.arrive.get(key, -np.inf) > self.now:
                    out.append(self.arrive[key])
        return out


def instruction_overhead_s(pipeline_op_s: float, positions: int) -> float:
    """Seconds a device adds to each forward or backward instruction of a pipeline stage (``GpuType.pipeline_op_s``;
    none without a pipeline)."""
    return pipeline_op_s if positions > 1 else 0.0


def shared_iteration_s(fwd_s: np.ndarray, bwd_s: np.ndarray, p2p_fwd_s: np.ndarray, p2p_bwd_s: np.ndarray,
                       gas: int | Sequence[int],
                       processors: Sequence[Sequence[Sequence[int]]], schedule: str,
                       efficiency: Sequence[float] | None, sync_s: np.ndarray, optimizer_s: np.ndarray,
                       grad_sent: Sequence[bool] | None = None) -> float:
    """Iteration seconds when devices time-share processors (cluster ``processors:``): every replica's pipeline
    simulated together with each processor shared among the computations on it (:func:`simulate_shared`, at the
    node's ``efficiency``), then the tail — per processor, the slowest gradient all-reduce of its ranks
    (``sync_s[stage]``) and their optimizer steps (``optimizer_s[stage]``) together. ``processors[r][j]``: the
    processor of each tensor-parallel rank of replica r's stage j."""
    makespan = simulate_shared(fwd_s, bwd_s, p2p_fwd_s, p2p_bwd_s, gas, processors, schedule, efficiency, grad_sent)
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
