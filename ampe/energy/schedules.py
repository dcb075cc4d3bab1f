"""Per-stage execution order of one training iteration, for each pipeline schedule.

A schedule yields, for one stage, its computations in execution order as :class:`ScheduleStep` (instruction,
micro-batch, model chunk). ``chunk`` is always 0 for 1F1B and GPipe; interleaved 1F1B (Megatron-LM,
``virtual_stages`` chunks per device) emits chunk > 0, virtual stage = chunk · num_stages + stage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

FORWARD = "forward"
BACKWARD = "backward"


class ScheduleStep(NamedTuple):
    """One computation of a stage: ``instruction`` ("forward"/"backward") of ``microbatch`` on model ``chunk``."""

    instruction: str
    microbatch: int
    chunk: int = 0


def one_f_one_b(num_stages: int, num_microbatches: int, stage: int) -> list[ScheduleStep]:
    """1F1B exactly as DeepSpeed's ``TrainSchedule.steps`` orders the forward/backward passes of ``stage``.

    Stage s runs min(N − s, M) warm-up forwards, then alternates backward/forward, then drains the backwards.
    """
    n, m, s = num_stages, num_microbatches, stage
    out = []
    for step in range(2 * (m + n - 1)):
        even_step, even_stage = step % 2 == 0, s % 2 == 0
        if even_step == even_stage:  # DeepSpeed: forward on (even, even) and (odd, odd)
            mb = (step if even_step else step - 1) // 2 - s // 2
            forward = True
        elif even_step:  # even step, odd stage
            mb = step // 2 - n + (s + 1) // 2
            forward = False
        else:  # odd step, even stage
            mb = (step - 1) // 2 - n + 1 + s // 2
            forward = False
        if 0 <= mb < m:
            out.append(ScheduleStep(FORWARD if forward else BACKWARD, mb))
    return out


def gpipe(num_stages: int, num_microbatches: int, stage: int) -> list[ScheduleStep]:
    """GPipe: all forwards of the iteration, then all backwards (micro-batch order in both phases)."""
    return ([ScheduleStep(FORWARD, mb) for mb in range(num_microbatches)]
            + [ScheduleStep(BACKWARD, mb) for mb in range(num_microbatches)])


def interleaved(num_stages: int, num_microbatches: int, stage: int, virtual_stages: int = 2) -> list[ScheduleStep]:
    """Megatron-LM's interleaved 1F1B for ``virtual_stages`` model chunks per device (the cost model's order, so
    the energy DAG and the iteration-time simulation agree). Needs num_microbatches % num_stages == 0."""
    from ampe.costmodel.pipeline import schedule_order

    if num_microbatches % num_stages:
        raise ValueError("interleaved 1F1B needs the number of micro-batches to be a multiple of the stages")
    return [ScheduleStep(op.kind, op.microbatch, op.chunk)
            for op in schedule_order("interleaved", stage, num_stages, num_microbatches, virtual_stages)]


SCHEDULES: dict[str, Callable[..., list[ScheduleStep]]] = {"1f1b": one_f_one_b, "gpipe": gpipe,
                                                          "interleaved": interleaved}


def stage_orders(schedule: str, num_stages: int, num_microbatches: int,
                 virtual_stages: int = 1) -> list[list[ScheduleStep]]:
    """Execution order of every stage for ``schedule`` ("1f1b", "gpipe" or "interleaved")."""
    try:
        fn = SCHEDULES[schedule]
    except KeyError:
        raise ValueError(f"unknown schedule {schedule!r}; known: {', '.join(SCHEDULES)}") from None
    if num_stages < 1 or num_microbatches < 1:
        raise ValueError("need at least one stage and one micro-batch")
    if schedule == "interleaved":
        if virtual_stages < 2:
            raise ValueError("interleaved 1F1B needs at least 2 virtual stages")
        return [fn(num_stages, num_microbatches, s, virtual_stages) for s in range(num_stages)]
    if virtual_stages != 1:
        raise ValueError(f"{schedule} has no virtual stages")
    return [fn(num_stages, num_microbatches, s) for s in range(num_stages)]
