"""Per-stage execution order of one training iteration, for each pipeline schedule: the one generator the cost
model's schedule simulation (:mod:`ampe.costmodel.pipeline`) and the energy planner's computation DAG
(:mod:`ampe.energy.pipeline_dag`) both use, so the two always run the same order.

A schedule yields, for one stage (device), its computations in execution order as :class:`ScheduleStep`
(instruction, micro-batch, model chunk). ``chunk`` is always 0 for 1F1B and GPipe; interleaved 1F1B (Megatron-LM,
``virtual_stages`` chunks per device) emits chunk > 0, pipeline position = chunk · pp + stage.

* ``1f1b``: DeepSpeed's ``TrainSchedule`` — min(pp − stage, gas) warm-up forwards, then alternate backward/forward,
  then drain the backwards (tests/energy/test_energy_schedules.py holds it to DeepSpeed's own step mapping);
* ``gpipe``: all forwards, then all backwards (in micro-batch order);
* ``interleaved``: Megatron-LM's ``forward_backward_pipelining_with_interleaving`` (needs gas % pp == 0).

:func:`deepspeed_instructions` gives a 1F1B stage's whole instruction stream as DeepSpeed's ``TrainSchedule`` emits it,
transfers included (each ``SendActivation`` of a forward waits for the next step, after that step's ``RecvGrad``):
what the blocking simulation (:func:`ampe.costmodel.pipeline.simulate`) runs.
"""

from __future__ import annotations

from typing import NamedTuple

from ampe.costmodel.strategy import SCHEDULES

FORWARD = "forward"
BACKWARD = "backward"
SEND_ACTIVATION = "send_activation"  # to the next stage
RECV_ACTIVATION = "recv_activation"  # from the previous stage
SEND_GRAD = "send_grad"  # to the previous stage
RECV_GRAD = "recv_grad"  # from the next stage


class ScheduleStep(NamedTuple):
    """One computation of a stage: ``instruction`` ("forward"/"backward") of ``microbatch`` on model ``chunk``."""

    instruction: str
    microbatch: int
    chunk: int = 0


def schedule_order(schedule: str, stage: int, pp: int, gas: int, virtual_stages: int = 1) -> list[ScheduleStep]:
    """Execution order of one pipeline stage (device) for one iteration of ``gas`` micro-batches (unchecked: see
    :func:`stage_orders`). An interleaved schedule with one virtual stage is 1F1B."""
    if schedule == "gpipe":
        return [ScheduleStep(FORWARD, m) for m in range(gas)] + [ScheduleStep(BACKWARD, m) for m in range(gas)]
    if schedule == "interleaved" and virtual_stages > 1:
        return _interleaved_order(stage, pp, gas, virtual_stages)
    warm = min(pp - stage, gas)
    ops = [ScheduleStep(FORWARD, m) for m in range(warm)]
    nf, nb = warm, 0
    while nb < gas:
        ops.append(ScheduleStep(BACKWARD, nb))
        nb += 1
        if nf < gas:
            ops.append(ScheduleStep(FORWARD, nf))
            nf += 1
    return ops


def deepspeed_instructions(stage: int, pp: int, gas: int) -> list[ScheduleStep]:
    """The instruction stream of one 1F1B stage as DeepSpeed's ``TrainSchedule.steps()`` emits it (computations and
    transfers; loads and the optimizer step left out): 2·(gas + pp − 1) steps, each forward step ``SendGrad`` (of
    the previous step's backward), ``RecvActivation``, ``ForwardPass``; each backward step ``RecvGrad``,
    ``SendActivation`` (of the previous step's forward), ``BackwardPass``; a stage's steps alternate between the two
    (DeepSpeed's even/odd step mapping), with no micro-batch in the warm-up and cool-down gaps."""
    out: list[ScheduleStep] = []
    prev = -1
    first, last = stage == 0, stage == pp - 1
    for step in range(2 * (gas + pp - 1)):
        mb, forward = _deepspeed_step(step, stage, pp)
        now, before = 0 <= mb < gas, 0 <= prev < gas
        if forward:
            out += [ScheduleStep(SEND_GRAD, prev)] if before and not first else []
            out += [ScheduleStep(RECV_ACTIVATION, mb)] if now and not first else []
            out += [ScheduleStep(FORWARD, mb)] if now else []
        else:
            out += [ScheduleStep(RECV_GRAD, mb)] if now and not last else []
            out += [ScheduleStep(SEND_ACTIVATION, prev)] if before and not last else []
            out += [ScheduleStep(BACKWARD, mb)] if now else []
        prev = mb
    return out


def _deepspeed_step(step: int, stage: int, pp: int) -> tuple[int, bool]:
    """(micro-batch, is forward) of ``step`` on ``stage``: DeepSpeed ``TrainSchedule._step_to_micro_batch``."""
    if step % 2 == stage % 2:  # even step on an even stage, odd on odd: a forward
        return (step - stage % 2) // 2 - stage // 2, True
    if step % 2 == 0:  # even step, odd stage
        return step // 2 - pp + (stage + 1) // 2, False
    return (step - 1) // 2 - pp + 1 + stage // 2, False


def _interleaved_order(stage: int, pp: int, gas: int, v: int) -> list[ScheduleStep]:
    """Megatron-LM ``forward_backward_pipelining_with_interleaving`` order for one device."""
    total = gas * v

    def chunk_of(k: int, forward: bool) -> int:
        c = (k % (pp * v)) // pp
        return c if forward else v - 1 - c

    def mb_of(k: int) -> int:
        group, within = divmod(k, pp * v)
        return group * pp + within % pp

    warm = min((pp - stage - 1) * 2 + (v - 1) * pp, total)
    ops: list[ScheduleStep] = []
    kf = kb = 0
    for _ in range(warm):
        ops.append(ScheduleStep(FORWARD, mb_of(kf), chunk_of(kf, True)))
        kf += 1
    while kb < total:
        if kf < total:
            ops.append(ScheduleStep(FORWARD, mb_of(kf), chunk_of(kf, True)))
            kf += 1
        ops.append(ScheduleStep(BACKWARD, mb_of(kb), chunk_of(kb, False)))
        kb += 1
    return ops


def stage_orders(schedule: str, num_stages: int, num_microbatches: int,
                 virtual_stages: int = 1) -> list[list[ScheduleStep]]:
    """Execution order of every stage for ``schedule`` ("1f1b", "gpipe" or "interleaved"), checked: ValueError for
    an unknown schedule, no stage or micro-batch, virtual stages where the schedule has none, or an interleaved
    schedule with fewer than 2 of them or micro-batches not a multiple of the stages."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
    if num_stages < 1 or num_microbatches < 1:
        raise ValueError("need at least one stage and one micro-batch")
    if schedule == "interleaved":
        if virtual_stages < 2:
            raise ValueError("interleaved 1F1B needs at least 2 virtual stages")
        if num_microbatches % num_stages:
            raise ValueError("interleaved 1F1B needs the number of micro-batches to be a multiple of the stages")
    elif virtual_stages != 1:
        raise ValueError(f"{schedule} has no virtual stages")
    return [schedule_order(schedule, s, num_stages, num_microbatches, virtual_stages) for s in range(num_stages)]
