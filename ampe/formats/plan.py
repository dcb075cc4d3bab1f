"""``ampe.plan/1``: ranked parallel strategies for one cluster and model, as ``ampe search`` and ``ampe replan`` write
them and every command that takes ``--plan`` reads them (reference: docs/reference/plan_json.md).

Every strategy entry is also valid input to ``ampe evaluate --strategy`` (it carries pp, dp, tp, mbs, gbs, gas,
partition, placement and schedule) and carries a ready-to-use DeepSpeed config. :func:`plan_json_schema` gives the
JSON Schema of the format, generated from these models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Self

from pydantic import ConfigDict, Field, PrivateAttr, SerializerFunctionWrapHandler, model_serializer, model_validator

from ampe.errors import InputError
from ampe.formats._base import (
    FileModel,
    Flag,
    IterationSeconds,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Text,
)
from ampe.formats.frequency_plan import FrequencyPlan

PLAN_SCHEMA: Literal["ampe.plan/1"] = "ampe.plan/1"
SCHEDULES = ("1f1b", "gpipe", "interleaved")
ObjectiveName = Literal["time", "energy", "edp", "cost", "carbon"]  # what a search ranks by (`--objective`)
PlannerName = Literal["perseus", "envpipe", "global"]  # the energy planner (`--energy-planner`, not none)
PipelineMethod = Literal["eq5", "simulate"]  # the pipeline time a search ranks by (`--method`)
MAX_PLAN_BYTES = 256 << 20  # a plan is a few MB even for thousands of GPUs


class DeviceEntry(FileModel):
    """One device of the cluster the plan was made for."""

    id: NonNegativeInt
    node: Text
    gpu: Text


class PlanInputs(FileModel):
    """How to reproduce the plan: the inputs the search was given (paths as typed on its command line)."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)  # later versions may record more
    cluster_spec: Text | None = None
    model: Text | None = None
    profile: Text | None = None
    calibration: Text | None = None  # the profile's calibration sidecar, when it had one (applied)
    cost_model: Literal["ampe", "amp"] | None = None
    frozen_layers: NonNegativeInt | None = None
    schedules: Text | None = None
    attention: Literal["eager", "flash"] | None = None  # the model's attention kernel the plan assumed
    tf32: Flag | None = None  # whether fp32 matrix products may run as TF32 (`ampe search --tf32`); None: off
    seq_len: PositiveInt | None = None  # a Hugging Face config's --seq-len (tokens); None: the model's default
    # what the search ranked by (`--objective`); None: an older plan, or not a search's (then: time)
    objective: ObjectiveName | None = None
    devices: Literal["all", "auto"] | None = None  # `ampe search --devices`; None: an older plan (all)
    shares: Literal["auto", "equal"] | None = None  # `ampe search --shares`; None: an older plan (equal)
    relative_to: Literal["plan"] | None = None  # "plan": input paths are relative to the plan's folder only
    sha256: dict[str, Text] | None = None  # input field → SHA-256 of its file when the plan was made


class WriterOrdered(FileModel):
    """A section written with its keys in the order its writer gave them (a re-plan copies an old plan's ``search``
    section and adds to it: the copied keys stay where they were and a new one comes last, as before the section was
    typed), not in the order the fields are declared. Later versions may record more (extra keys are kept)."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)
    _order: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _remember_order(cls, data: Any, handler: Any) -> Any:
        made = handler(data)
        if isinstance(data, dict) and isinstance(made, WriterOrdered):
            made._order = tuple(data)
        return made

    @model_serializer(mode="wrap")
    def _in_writer_order(self, handler: SerializerFunctionWrapHandler) -> Any:
        out = handler(self)
        if not isinstance(out, dict) or not self._order:
            return out
        return {**{k: out[k] for k in self._order if k in out}, **out}

    def edited(self, drop: tuple[str, ...] = (), **fields: Any) -> Self:
        """This section without the fields named in ``drop`` and with ``fields`` set: a field it has keeps its
        place, a new one comes last (fields it never had stay absent in the written JSON)."""
        kept = {k: v for k, v in self.model_dump(exclude_unset=True).items() if k not in drop}
        return type(self).model_validate({**kept, **fields})


class EnergyStats(WriterOrdered):
    """``search.energy``: how the clocks were planned (objective, slowdown bound, times in s, planner and its knobs,
    strategies planned and screened, frontiers traced, seconds, τ's coarsening, variants added). A re-plan records
    the few it knows (objective, planner, and under an energy objective the bound)."""

    objective: ObjectiveName | None = None
    max_slowdown: NonNegativeFloat | None = None  # a fraction; None: no bound (time)
    fastest_s: NonNegativeFloat | None = None
    bound_s: NonNegativeFloat | None = None
    planner: PlannerName | None = None
    straggler: float | None = Field(default=None, ge=1)
    slack_margin: NonNegativeFloat | None = None
    unit_time_s: PositiveFloat | None = None  # τ as given (None: each strategy's default)
    evaluated: NonNegativeInt | None = None
    screened: NonNegativeInt | None = None
    frontiers: NonNegativeInt | None = None
    seconds: NonNegativeFloat | None = None
    coarsening: PositiveFloat | None = None
    spread_variants: NonNegativeInt | None = None
    share_variants: NonNegativeInt | None = None
    # `--priced-path`: true (`direct`, `--priced-direct`) every priced strategy's points were solved directly in its
    # cost window, false (`traced`) every one's frontier traced; absent (`auto`): each strategy's path by its work,
    # recorded in its `predicted.cost.direct`
    priced_direct: Flag | None = None
    # strategies whose energy DAG was over the planner's bound, `max_dag_nodes` (nodes): not planned, those that could
    # have taken a place listed last with an `energy_not_planned` caveat (absent: none)
    unplanned: NonNegativeInt | None = None
    max_dag_nodes: PositiveInt | None = None


class ReplannedFrom(WriterOrdered):
    """``search.replanned_from`` (``ampe replan``): the plan and rank re-planned; after a cluster change also the
    change as given, the objective chosen by and the re-plan's seconds (energy planning excluded)."""

    plan: Text
    rank: PositiveInt
    without: list[Text] | None = Field(default=None, fail_fast=True)
    add: Text | None = None
    slow: dict[Text, NonNegativeFloat] | None = None  # device or node → factor
    objective: ObjectiveName | None = None
    seconds: NonNegativeFloat | None = None
    cpu_seconds: NonNegativeFloat | None = None


class SearchStats(WriterOrdered):
    """What the search did (candidates costed, pruned, seconds, energy planning figures)."""

    candidates: NonNegativeInt
    pruned_oom: NonNegativeInt
    seconds: NonNegativeFloat
    degrees: NonNegativeInt | None = None  # (pp, dp, tp) triples searched
    jobs: PositiveInt | None = None
    method: PipelineMethod | None = None  # the pipeline time of the ranking
    cost_model: Literal["ampe", "amp"] | None = None
    ampe_predicts_oom: NonNegativeInt | None = None  # AMP's cost model: its candidates ampe's memory model refuses
    energy: EnergyStats | None = None
    replanned_from: ReplannedFrom | None = None


class PlanCost(FileModel):
    """Money and CO2e of one iteration at the strategy's chosen point, and of the training run when one was named
    (``ampe search`` with a priced cluster spec; figures absent where the spec lacks their prices). Added to
    ``ampe.plan/1`` as an optional object: plans without it read as before."""

    currency: Text
    devices: PositiveInt  # devices the strategy holds (rented and powered)
    gpu_hours_per_iteration: NonNegativeFloat
    energy_kwh_per_iteration: NonNegativeFloat  # at the facility meter: device energy × PUE
    per_iteration: NonNegativeFloat | None = None  # rent + electricity, currency units
    rent_per_iteration: NonNegativeFloat | None = None  # GPU-hours × price_per_hour
    electricity_per_iteration: NonNegativeFloat | None = None  # kWh × PUE × electricity_per_kwh
    per_million_tokens: NonNegativeFloat | None = None
    co2e_g_per_iteration: NonNegativeFloat | None = None  # kWh × PUE × carbon_g_per_kwh (no embodied carbon)
    iterations: PositiveInt | None = None  # the training run (--iterations / --tokens), when named
    per_run: NonNegativeFloat | None = None
    co2e_kg_per_run: NonNegativeFloat | None = None
    prices: Text  # where the figures came from: the spec's fields
    energy_source: Text  # how the energy was obtained (modelled, measured, mixed)
    # the point was solved directly in the strategy's cost window, no frontier traced (absent: traced, or outside the
    # slowdown bound: its T_min point; docs/energy.md §10.9)
    direct: Flag | None = None


class TrainingRunFigures(FileModel):
    """A training run's energy (kWh, all devices) and hours, with the frequency plan and with every clock at its
    maximum (``ampe search --iterations`` / ``--tokens``; :mod:`ampe.energy.run`)."""

    iterations: PositiveInt
    tokens: PositiveInt | None = None  # the run's tokens when it was given in tokens
    energy_kwh: NonNegativeFloat
    energy_max_clock_kwh: NonNegativeFloat
    saved_kwh: float  # negative when the plan costs more than every clock at maximum
    hours: NonNegativeFloat
    hours_max_clock: NonNegativeFloat


class Predicted(FileModel):
    """The cost model's figures for one strategy (seconds, bytes, joules, watts)."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)
    iteration_s: IterationSeconds
    samples_per_s: NonNegativeFloat | None = None
    max_memory_bytes: NonNegativeInt | None = None
    memory_bytes_per_stage: list[NonNegativeInt] = Field(default_factory=list, fail_fast=True)
    stage_times_s: list[NonNegativeFloat] = Field(default_factory=list, fail_fast=True)
    pipeline_s: list[NonNegativeFloat] = Field(default_factory=list, fail_fast=True)
    dp_sync_s: NonNegativeFloat | None = None
    fits: Flag | None = None
    method: Text | None = None
    compute_source: Text | None = None
    energy_j: NonNegativeFloat | None = None
    energy_max_clock_j: NonNegativeFloat | None = None
    energy_savings_pct: float | None = None
    average_power_w: NonNegativeFloat | None = None
    plan_time_s: IterationSeconds | None = None
    max_clock_time_s: IterationSeconds | None = None  # every clock at maximum, in the energy planner's exact schedule
    energy_source: Text | None = None
    within_slowdown: Flag | None = None
    pareto: Flag | None = None
    cost: PlanCost | None = None
    amp_iteration_s: IterationSeconds | None = None
    memory_breakdown: list[dict[str, float]] = Field(default_factory=list, fail_fast=True)  # [stage] bytes by component
    training_run: TrainingRunFigures | None = None  # with --iterations / --tokens (last: where older plans had it)


class DeepSpeedConfig(FileModel):
    """A DeepSpeed config (free-form beyond the batch figures, which must agree with the strategy)."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)
    train_batch_size: PositiveInt
    train_micro_batch_size_per_gpu: PositiveInt
    gradient_accumulation_steps: PositiveInt


class RuntimeSupport(FileModel):
    """Whether stock DeepSpeed can run the strategy's schedule, and why not."""

    deepspeed: Flag
    note: Text


#: What each kind of caveat is called in tables (``ampe search``, ``ampe report``)
CAVEAT_LABELS = {"memory_at_risk": "at risk", "not_runnable": "not runnable",
                 "energy_not_planned": "energy not planned"}


class Caveat(FileModel):
    """Why a ranked strategy may not run as planned: ``memory_at_risk`` (a device's predicted footprint is within
    its capacity but not within the reserve of it: it may run out of memory), ``not_runnable`` (ampe's trial
    worker cannot run it: ``runtime.note`` says why) or ``energy_not_planned`` (its energy DAG is over the
    planner's bound: no energy figures, no frequency plan; listed after every planned strategy). A plan ranks
    strategies with caveats after every strategy without one; ``note`` names the device and the figures, or the
    reason."""

    kind: Literal["memory_at_risk", "not_runnable", "energy_not_planned"]
    note: Text

    @property
    def label(self) -> str:
        """The caveat in a word or two, for a table column."""
        return CAVEAT_LABELS[self.kind]


class StrategyEntry(FileModel):
    """One ranked strategy: degrees, micro-batching, partition, placement, predictions, configs, clocks."""

    rank: PositiveInt
    pp: PositiveInt
    dp: PositiveInt
    tp: PositiveInt
    mbs: PositiveInt
    gbs: PositiveInt | None = None  # default: gas·dp·mbs, or mbs·Σ replica_gas
    gas: PositiveInt  # micro-batches per replica; with uneven shares the largest of replica_gas
    # each data-parallel replica's micro-batches per iteration when the shares differ (absent: equal shares, ``gas``
    # each; older plans read so)
    replica_gas: list[PositiveInt] | None = Field(default=None, fail_fast=True)
    partition: list[NonNegativeInt] = Field(min_length=2, fail_fast=True)
    placement: list[NonNegativeInt] = Field(min_length=1, fail_fast=True)
    schedule: Literal["1f1b", "gpipe", "interleaved"] = "1f1b"
    virtual_stages: PositiveInt = 1
    recompute: Literal["none", "selective", "full"] = "none"  # activation recomputation (the costliest stage's)
    # per pipeline stage, when the stages differ (absent: every stage runs ``recompute``; plans without it are read
    # as before)
    stage_recompute: list[Literal["none", "selective", "full"]] | None = Field(default=None, fail_fast=True)
    zero: Literal[0, 1] = 0  # ZeRO stage over the data-parallel group
    # the attention kernel and precision the entry was costed with (absent in older plans: inputs.attention and the
    # model's own precision)
    attention: Literal["eager", "flash"] | None = None
    dtype: Literal["fp32", "bf16", "fp16"] | None = None
    tf32: Flag | None = None  # fp32 matrix products may run as TF32 (the runtime sets it); absent: off
    # PyTorch's allocator setting the entry was costed with and runs with (absent: not set, PyTorch's default)
    expandable_segments: Flag | None = None
    placement_name: Text = ""
    placement_summary: Text = ""
    predicted: Predicted
    deepspeed: DeepSpeedConfig
    runtime: RuntimeSupport | None = None
    # why the strategy may not run as planned (absent or empty: none); ranked after those without
    caveats: list[Caveat] = Field(default_factory=list, fail_fast=True)
    frozen_layers: NonNegativeInt | None = None
    frequency_plan: FrequencyPlan | None = None

    @property
    def samples(self) -> int:
        """Samples per iteration this entry's shares make (mbs · micro-batches over every replica)."""
        return self.mbs * (sum(self.replica_gas) if self.replica_gas is not None else self.gas * self.dp)

    @model_validator(mode="after")
    def _consistent(self) -> StrategyEntry:
        if self.replica_gas is not None and (len(self.replica_gas) != self.dp
                                             or max(self.replica_gas) != self.gas):
            raise ValueError(f"replica_gas: needs one share per replica ({self.dp}) with gas ({self.gas}) the "
                                 f"largest, got {self.replica_gas}")
        if self.gbs is not None and self.gbs != self.samples:
            raise ValueError(f"gas: gas={self.gas} disagrees with gbs={self.gbs}, dp={self.dp}, mbs={self.mbs}")
        if len(self.placement) != self.pp * self.dp * self.tp:
            raise ValueError(f"placement: needs one device per rank ({self.pp * self.dp * self.tp}), got "
                             f"{len(self.placement)}")
        if len(self.partition) != self.pp * self.virtual_stages + 1:
            raise ValueError(f"partition: needs {self.pp * self.virtual_stages + 1} boundaries, got "
                             f"{len(self.partition)}")
        if self.stage_recompute is not None:
            if len(self.stage_recompute) != self.pp:
                raise ValueError(f"stage_recompute: needs one value per pipeline stage ({self.pp}), got "
                                 f"{len(self.stage_recompute)}")
            order = ("none", "selective", "full")
            if max(self.stage_recompute, key=order.index) != self.recompute:
                raise ValueError(f"recompute: {self.recompute!r} is not the costliest of stage_recompute")
        if self.frequency_plan is not None:
            # one list per device stage: with the interleaved schedule it holds every chunk's instructions
            why = self.frequency_plan.check_shape(self.pp, self.dp, self.replica_gas or self.gas, self.virtual_stages)
            if why:
                raise ValueError(f"frequency_plan.{why}")
        return self


class PlanFile(FileModel):
    """A whole plan file."""

    schema_: Literal["ampe.plan/1"] = Field(alias="schema")
    ampe_version: Text | None = None
    created: Text | None = None
    cluster: Text = Field(min_length=1)
    model: Text = Field(min_length=1)
    global_batch: PositiveInt
    devices: list[DeviceEntry] = Field(default_factory=list, fail_fast=True)
    inputs: PlanInputs = Field(default_factory=PlanInputs)
    search: SearchStats
    strategies: list[StrategyEntry] = Field(fail_fast=True)
    frozen_layers: NonNegativeInt | None = None  # `ampe replan --out`: the plan runs with this prefix frozen

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, populate_by_name=True)

    @model_validator(mode="after")
    def _ranks(self) -> PlanFile:
        seen: dict[int, int] = {}
        for i, s in enumerate(self.strategies):
            if s.rank in seen:
                raise ValueError(f"strategies[{i}].rank: rank {s.rank} is already used by strategies[{seen[s.rank]}]")
            seen[s.rank] = i
            gbs = s.samples
            if gbs != self.global_batch:
                raise ValueError(f"strategies[{i}].gas: gives a global batch of {gbs}, the plan's is "
                                 f"{self.global_batch}")
        return self

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (``schema`` first)."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


def load_plan_file(path: str | Path) -> PlanFile:
    """Read and validate a plan file (a regular file of at most MAX_PLAN_BYTES). Raises InputError."""
    from ampe.io import read_json

    doc = read_json(path)
    return PlanFile.parse(doc, str(path))


def plan_from_json(doc: Any, source: str) -> PlanFile:
    """Validate an already parsed plan (InputError naming ``source`` and the field)."""
    if not isinstance(doc, dict):
        raise InputError(source, "(root)", "a plan must be a JSON object")
    return PlanFile.parse(doc, source)


def plan_json_schema() -> dict[str, Any]:
    """The JSON Schema of ``ampe.plan/1`` files, generated from :class:`PlanFile`."""
    return PlanFile.model_json_schema(by_alias=True)
