"""The frequency plan of one strategy: the SM clock of every forward and backward of one iteration, per pipeline stage,
in execution order (``ampe search`` writes it into plans; the trial runner passes it to every rank in ``job.json``).

JSON::

    {"stages": [[["forward", 0, 1410], ["forward", 1, 1230], ["backward", 0, 1410], ...],   # stage 0
                ...],
     "replicas": [{"stages": [...], "pipeline_time_s": 1.2}, ...],   # only when data-parallel replicas differ
     "replica_plan": [0, 1, 1, 0, ...],                            # optional: replica r runs replicas[i_r]
     "time_s": 1.25, "energy_j": 4567.8, ...}

Clocks are whole MHz (what NVML takes), 1..MAX_MHZ. ``stages`` is replica 0's lists; with ``replicas`` each
data-parallel replica runs its own: ``replicas[r]``, or, with ``replica_plan``, ``replicas[replica_plan[r]]`` (the
distinct plans once each: 128 replicas of 3 kinds at 16 stages × 128 micro-batches are 3 entries, not 128).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import FailFast, Field, Strict, TypeAdapter, ValidationError

from ampe.errors import InputError, field_path
from ampe.formats._base import MAX_MHZ, FileModel, Mhz, NonNegativeFloat, NonNegativeInt, PositiveFloat, Text

Instruction = Literal["forward", "backward"]
ClockStep = tuple[Instruction, NonNegativeInt, Mhz]  # (instruction, micro-batch, SM clock in MHz)
StageSteps = list[Annotated[list[ClockStep], FailFast()]]  # one list per pipeline stage (the first bad step ends it)


class ReplicaPlan(FileModel):
    """One data-parallel replica's own stage lists (heterogeneous replicas run different plans)."""

    stages: StageSteps = Field(min_length=1, fail_fast=True)
    pipeline_time_s: NonNegativeFloat | None = None


class FrequencyPlan(FileModel):
    """Per-stage clock lists of one strategy and the predicted figures of the chosen point (s, J)."""

    stages: StageSteps = Field(min_length=1, fail_fast=True)
    replicas: list[ReplicaPlan] | None = Field(default=None, fail_fast=True)
    # per replica: its entry of `replicas` (distinct plans once)
    replica_plan: list[NonNegativeInt] | None = Field(default=None, fail_fast=True)
    time_s: NonNegativeFloat | None = None
    energy_j: NonNegativeFloat | None = None
    energy_max_clock_j: NonNegativeFloat | None = None
    pipeline_time_s: NonNegativeFloat | None = None
    planner: Literal["perseus", "envpipe", "global"] | None = None
    unit_time_s: PositiveFloat | None = None
    straggler: float | None = Field(default=None, ge=1)
    margin: Annotated[float, Strict(), Field(ge=0, le=1)] | None = None  # a share; at most 100 % (ampe search)
    energy_source: Text | None = None
    # the GPU type of each stage (the runner adds it for the emulator)
    gpu_types: list[Text] | None = Field(default=None, fail_fast=True)

    def replica_stages(self, replica: int) -> StageSteps:
        """The stage lists data-parallel ``replica`` runs."""
        if self.replicas is None:
            return self.stages
        return self.replicas[replica if self.replica_plan is None else self.replica_plan[replica]].stages

    def check_shape(self, pp: int, dp: int, gas: int | Sequence[int] | None = None,
                    virtual_stages: int = 1) -> str | None:
        """Why the plan does not fit a pp-stage, dp-replica strategy (a field path and reason), or None. With
        ``gas`` (micro-batches per iteration: one for every replica, or each replica's under uneven shares) every
        stage list must also hold each of its replica's micro-batches' forward and backward exactly once per
        virtual stage — no micro-batch 99 of 8, none missing or repeated."""
        if len(self.stages) != pp:
            return f"stages: needs one list per pipeline stage ({pp}), got {len(self.stages)}"
        if self.replica_plan is not None:
            if self.replicas is None:
                return "replica_plan: names entries of `replicas`, which the plan does not have"
            if len(self.replica_plan) != dp:
                return (f"replica_plan: needs one entry per data-parallel replica ({dp}), got "
                        f"{len(self.replica_plan)}")
            bad = next((r for r, i in enumerate(self.replica_plan) if i >= len(self.replicas)), None)
            if bad is not None:
                return (f"replica_plan[{bad}]: {self.replica_plan[bad]} is not an entry of `replicas` "
                        f"(0..{len(self.replicas) - 1})")
        if self.replicas is not None:
            if self.replica_plan is None and len(self.replicas) != dp:
                return f"replicas: needs one entry per data-parallel replica ({dp}), got {len(self.replicas)}"
            for r, rep in enumerate(self.replicas):
                if len(rep.stages) != pp:
                    return f"replicas[{r}].stages: needs one list per pipeline stage ({pp}), got {len(rep.stages)}"
            first = self.replica_plan[0] if self.replica_plan is not None else 0
            if self.replicas[first].stages != self.stages:  # `stages` keys the trial; it must be what replica 0 runs
                return f"stages: differs from what replica 0 runs (replicas[{first}].stages); they must be equal"
        named = [("stages", self.stages)] + [(f"replicas[{r}].stages", rep.stages)
                                             for r, rep in enumerate(self.replicas or [])]
        for name, lists in named:
            for j, stage in enumerate(lists):
                if not stage:
                    return f"{name}[{j}]: must be a non-empty list of [instruction, microbatch, MHz]"
        if gas is None:
            return None
        per = [gas] * dp if isinstance(gas, int) else list(gas)
        if self.replicas is None and len(set(per)) > 1:
            return ("stages: one schedule for replicas that run different numbers of micro-batches "
                    f"({':'.join(map(str, per))}); give each its own under `replicas`")
        counts = [per[0]]  # `stages`: replica 0's
        for i in range(len(self.replicas or [])):
            users = [r for r in range(dp) if (r if self.replica_plan is None else self.replica_plan[r]) == i]
            shares = {per[r] for r in users if r < len(per)}
            if len(shares) > 1:
                return f"replicas[{i}]: shared by replicas that run different numbers of micro-batches"
            counts.append(shares.pop() if shares else max(per))
        for (name, lists), n in zip(named, counts, strict=True):
            for j, stage in enumerate(lists):
                why = _steps_problem(stage, n, virtual_stages)
                if why:
                    return f"{name}[{j}]: {why}"
        return None


def _steps_problem(stage: list[ClockStep], gas: int, virtual_stages: int) -> str | None:
    """Why one stage's steps are not one iteration of ``gas`` micro-batches (each forward and backward once per
    virtual stage), or None."""
    for instruction in ("forward", "backward"):
        mbs = [mb for i, mb, _ in stage if i == instruction]
        beyond = next((mb for mb in mbs if mb >= gas), None)
        if beyond is not None:
            return (f"{instruction} of micro-batch {beyond}, but the strategy runs {gas} micro-batches per iteration "
                    f"(0..{gas - 1})")
        counts = Counter(mbs)
        if len(mbs) != gas * virtual_stages or any(c != virtual_stages for c in counts.values()):
            odd = next((mb for mb in range(gas) if counts.get(mb, 0) != virtual_stages), 0)
            times = "once" if virtual_stages == 1 else f"{virtual_stages} times (once per virtual stage)"
            return (f"needs the {instruction} of every micro-batch 0..{gas - 1} {times}; micro-batch {odd} has "
                    f"{counts.get(odd, 0)}")
    return None


_STAGE_STEPS = TypeAdapter(StageSteps)


def parse_stage_steps(raw: object, source: str, where: str) -> StageSteps:
    """Validate per-stage ``[[instruction, microbatch, MHz], ...]`` lists outside a :class:`FrequencyPlan` (the
    frontier's points); InputError names ``where[s][k]``."""
    if not isinstance(raw, list) or not raw:
        raise InputError(source, where, "must be a non-empty list of stages")
    try:
        return _STAGE_STEPS.validate_python(raw)
    except ValidationError as e:
        first = e.errors()[0]
        entry = list(first.get("loc", ()))[:2]  # [stage][step]: the entry as a whole
        raise InputError(source, f"{where}{field_path(entry).removeprefix('(root)')}",
                         f"must be [\"forward\"|\"backward\", microbatch ≥ 0, MHz 1..{MAX_MHZ}]: "
                         f"{first.get('msg', 'invalid value')}") from None
