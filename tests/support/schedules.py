"""Per-stage schedule orders by name, for tests (the product asks :func:`ampe.costmodel.schedules.schedule_order`)."""

from __future__ import annotations

from ampe.costmodel.schedules import ScheduleStep, schedule_order


def one_f_one_b(num_stages: int, num_microbatches: int, stage: int) -> list[ScheduleStep]:
    """1F1B order of ``stage``."""
    return schedule_order("1f1b", stage, num_stages, num_microbatches)


def gpipe(num_stages: int, num_microbatches: int, stage: int) -> list[ScheduleStep]:
    """GPipe order of ``stage``."""
    return schedule_order("gpipe", stage, num_stages, num_microbatches)
