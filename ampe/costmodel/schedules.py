"""Per-stage execution order of one training iteration, for each pipeline schedule: the one generator the cost
model's schedule simulation (:mod:`ampe.costmodel.pipeline`) and the energy planner's computation DAG
(:mod:`ampe.energy.dag`) both use, so the two always run the same order.

A schedule yields, for one stage (device), its computations in execution order as :class:`ScheduleStep`
(instruction, micro-batch, model chunk). ``chunk`` is always 0 for 1F1B and GPipe; interleaved 1F1B (Megatron-LM,
``virtual_stages`` chunks per device) emits chunk > 0, pipeline position = chunk · pp + stage.

* ``1f1b``: DeepSpeed's ``TrainSchedule`` — min(pp − stage, gas) warm-up forwards, then alternate backward/forward,
  then drain the backwards (tests/energy/test_energy_schedules.py holds it to DeepSpeed's own step mapping);
* ``gpipe``: all forwards, then all backwards (in micro-batch order);
* ``interleaved``: Megatron-LM's ``forward_backward_pipelining_with_interleaving`` (needs gas % pp == 0).
"""

from __future__ import annotations

from typing import NamedTuple

from ampe.costmodel.strategy import SCHEDULES

FORWARD = "forward"
BACKWARD = "backward"


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


def one_f_one_b(num_stages: int, num_microbatches: int, stage: int) -> list[ScheduleStep]:
    """1F1B order of ``stage`` (:func:`schedule_order`)."""
    return schedule_order("1f1b", stage, num_stages, num_microbatches)


def gpipe(num_stages: int, num_microbatches: int, stage: int) -> list[ScheduleStep]:
    """GPipe order of ``stage`` (:func:`schedule_order`)."""
    return schedule_order("gpipe", stage, num_stages, num_microbatches)


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
