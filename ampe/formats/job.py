"""``ampe.job/1``: what the trial runner hands every rank of one trial (``JOB_DIR/job.json``; contract in
docs/trials.md). The runner writes it with :class:`JobFile` and the worker reads it with the same model."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from ampe.formats._base import FileModel, Flag, NonNegativeInt, PositiveInt, Text
from ampe.formats.frequency_plan import FrequencyPlan

JOB_SCHEMA = "ampe.job/1"
DTYPES = {"cpu": ("fp32", "bf16"), "cuda": ("fp32", "fp16", "bf16")}  # what the worker can train in, per device


class JobFile(FileModel):
    """One trial's job: model, strategy, clocks, iterations and where to write (paths absolute)."""

    schema_: Literal["ampe.job/1"] = Field(default="ampe.job/1", alias="schema")
    trial_id: Text = "trial"
    model: Text = Field(min_length=1)
    strategy: dict[str, Any]  # validated by ampe.costmodel.strategy against the model and world size
    frequency_plan: FrequencyPlan | None = None
    freq_backend: Literal["nvml", "emulate", "none"] = "none"
    gpu_types: list[Text] = Field(default_factory=list, fail_fast=True)  # GPU type per device id
    # GPU index within its host, per device id
    device_local_index: list[NonNegativeInt] | None = Field(default=None, fail_fast=True)
    warmup_iters: NonNegativeInt = 2
    timed_iters: PositiveInt = 8
    seed: NonNegativeInt = 0
    dtype: Literal["fp32", "fp16", "bf16"] = "fp32"
    # the attention kernel the plan was costed with; None (older jobs): the model's default
    attention: Literal["eager", "flash"] | None = None
    # fp32 matrix products as TF32 (both torch flags); None (older jobs): PyTorch's defaults, left alone
    tf32: Flag | None = None
    seq_len: PositiveInt | None = None  # a Hugging Face config's sequence length (the plan's --seq-len)
    device: Literal["cpu", "cuda"] = "cpu"
    frozen_layers: NonNegativeInt = 0
    out_dir: Text | None = None  # default: the job file's folder
    dropout: float = Field(default=0.1, ge=0, lt=1)
    alternate_schedule: Flag = False  # timed iterations alternate without / with the plan (A/B)
    # timed (and warm-up) iterations alternate between the strategy's shares and these, one per replica (A/B)
    alternate_shares: list[PositiveInt] | None = Field(default=None, fail_fast=True)
    # every rank writes its parameters after the last iteration (parameters_rank{R}.pt, with each shard's place in
    # the tp = 1 tensor): what compares a tensor-parallel run with the same run at tp = 1
    save_parameters: Flag = False
    # emulated mixed speeds (CPU): per device id, how much longer that device computes than the fastest type of the
    # cluster (≥ 1); a rank stretches its forward and backward by its device's factor. None: no emulation
    speed_ratio: list[Annotated[float, Field(ge=1, le=1000)]] | None = Field(default=None, fail_fast=True)

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, populate_by_name=True)

    @model_validator(mode="after")
    def _dtype_on_device(self) -> JobFile:
        if self.dtype not in DTYPES[self.device]:
            raise ValueError(f"dtype: {self.dtype!r} is not supported on {self.device} "
                             f"(use {', '.join(DTYPES[self.device])})")
        return self

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict with every field (``schema`` included; absent optional fields as null)."""
        return self.model_dump(mode="json", by_alias=True)
