"""Measurements JSONL: one measured strategy per line, from any source — ampe's own trials, the recorder in
``ampe.runtime`` a user puts in their own training script, or a hand-written log. ``ampe report --measurements``
reads it with :class:`Measurement`; writers use the same model (reference: docs/reference/measurements.md).

Each line::

    {"strategy": {"pp": 2, "dp": 1, "tp": 1, "mbs": 4, "gbs": 32, "partition": [0, 14, 30]
                  [, "placement": [...]][, "schedule": "1f1b"][, "virtual_stages": 1]
                  [, "recompute": "none" | "selective" | "full"][, "stage_recompute": [...]][, "zero": 0 | 1]
                  [, "attention": "eager" | "flash"][, "dtype": "fp32" | "bf16" | "fp16"]
                  [, "tf32": true | false][, "expandable_segments": true | false]
                  [, "replica_gas": [5, 3]]},
     "iteration_s": 1.37 | null, "status": "ok" | "oom" | "failed"
     [, "peak_memory_bytes": 123][, "energy_j": 456.0][, "energy_source": "nvml" | "measured" | "modelled"]}

The memory options and kernels say how the strategy ran: recomputation (one value, or one per pipeline stage), the
ZeRO stage, the attention kernel, the training precision and whether fp32 matrix products ran as TF32. A line
without them (older files) is re-predicted with no recomputation, no ZeRO and the model's own attention and precision
(TF32 off, PyTorch's default, for fp32); ``ampe report`` says so (``tf32`` only where the line ran fp32 on a cluster
with a TF32 GPU). ``replica_gas``: each data-parallel replica's micro-batches per iteration when the shares were
uneven (``mbs·Σ replica_gas = gbs``); absent: equal shares, as every older line ran.

``iteration_s`` is the mean seconds per training iteration (required when ``status`` is ``ok``, null otherwise);
``peak_memory_bytes`` the largest peak over the ranks; ``energy_j`` joules per iteration over all the strategy's
GPUs, and ``energy_source`` where they came from: ``nvml`` (NVML's energy counter), ``measured`` (any other meter; what
a line without the field means) or ``modelled`` (ampe's DVFS model, e.g. the recorder on a CPU). Blank lines and
lines starting with ``#`` are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, Strict, field_validator, model_validator

from ampe.errors import InputError
from ampe.formats._base import FileModel, IterationSeconds, NonNegativeInt, PositiveInt
from ampe.io import parse_json, read_text, undecodable

MAX_LINES = 100_000  # a measurement log of a planner's candidates; far more is not a measurement file
# Beyond these a number is a unit mistake, not a measurement: a training iteration of more than 11.6 days, a GPU
# with more than 1 PiB, a petajoule per iteration.
MAX_ITERATION_S = 1e6  # ampe.plausible.ITERATION_S's upper end, for the figures beside it
MAX_MEMORY_BYTES = 1 << 50
MAX_ENERGY_J = 1e15
#: the strategy fields that say how it ran (memory options, attention kernel, precision), as opposed to its layout
RUN_FIELDS = ("recompute", "zero", "attention", "dtype", "tf32")


class MeasuredStrategy(FileModel):
    """The strategy a measurement is of (degrees, micro-batch and global batch in samples, partition by layer)."""

    pp: PositiveInt
    dp: PositiveInt
    tp: PositiveInt
    mbs: PositiveInt
    gbs: PositiveInt
    partition: tuple[NonNegativeInt, ...] = Field(min_length=2, max_length=100_001, fail_fast=True)
    placement: tuple[NonNegativeInt, ...] | None = Field(default=None, max_length=1 << 20, fail_fast=True)
    schedule: Literal["1f1b", "gpipe", "interleaved"] | None = None
    virtual_stages: PositiveInt | None = None
    recompute: Literal["none", "selective", "full"] | None = None
    stage_recompute: tuple[Literal["none", "selective", "full"], ...] | None = Field(default=None, max_length=1 << 16,
                                                                                      fail_fast=True)
    zero: Literal[0, 1] | None = None
    attention: Literal["eager", "flash"] | None = None
    dtype: Literal["fp32", "bf16", "fp16"] | None = None
    tf32: Annotated[bool, Strict()] | None = None  # fp32 matrix products ran as TF32
    # PyTorch's allocator setting the ranks ran with (absent: not set, PyTorch's default; not a RUN_FIELDS entry:
    # older lines without it ran with the default)
    expandable_segments: Annotated[bool, Strict()] | None = None
    frozen_layers: NonNegativeInt | None = None  # the first N layers trained frozen (a `replan --frozen-layers` plan)
    # each data-parallel replica's micro-batches per iteration (absent: equal shares, gbs/(dp·mbs) each)
    replica_gas: tuple[PositiveInt, ...] | None = Field(default=None, max_length=1 << 16, fail_fast=True)

    @model_validator(mode="after")
    def _shares_make_the_batch(self) -> MeasuredStrategy:
        if self.replica_gas is not None and (len(self.replica_gas) != self.dp
                                             or self.mbs * sum(self.replica_gas) != self.gbs):
            raise ValueError(f"replica_gas: needs one share per replica ({self.dp}) with mbs·Σ = gbs ({self.gbs}), "
                             f"got {list(self.replica_gas)[:8]}")
        return self

    @field_validator("zero", mode="before")
    @classmethod
    def _zero_is_a_stage_number(cls, v: object) -> object:
        if isinstance(v, bool | float):  # `true` or 1.0 is no ZeRO stage: a typing mistake
            raise ValueError(f"must be the integer 0 or 1 (a ZeRO stage), got {v!r}")
        return v

    def unnamed(self) -> tuple[str, ...]:
        """How-it-ran fields this line leaves out (a reader assumes the defaults for them); ``tf32`` only on a line
        that ran fp32 (it changes nothing in 16-bit)."""
        return tuple(k for k in RUN_FIELDS if getattr(self, k) is None
                     and not (k == "recompute" and self.stage_recompute is not None)
                     and not (k == "tf32" and self.dtype != "fp32"))


class Measurement(FileModel):
    """One measured run of a strategy (seconds per iteration, bytes, joules per iteration)."""

    strategy: MeasuredStrategy
    iteration_s: IterationSeconds | None
    status: Literal["ok", "oom", "failed"]
    peak_memory_bytes: Annotated[int, Strict(), Field(ge=0, le=MAX_MEMORY_BYTES)] | None = None
    energy_j: Annotated[float, Strict(), Field(ge=0, le=MAX_ENERGY_J)] | None = None
    energy_source: Literal["nvml", "measured", "modelled"] | None = None  # of energy_j; absent: measured

    @model_validator(mode="after")
    def _time_iff_ok(self) -> Measurement:
        if self.status == "ok" and self.iteration_s is None:
            raise ValueError("iteration_s: required (a positive number of seconds) when status is ok")
        if self.status != "ok" and self.iteration_s is not None:
            raise ValueError(f"iteration_s: must be null when status is {self.status}")
        return self

    def strategy_dict(self) -> dict:
        """The strategy as the cost model's ``strategy_from_dict`` reads it."""
        return self.strategy.to_json()


@dataclass(frozen=True)
class MeasurementLine:
    """A good line: its 1-based line number and the record."""

    line: int
    record: Measurement


@dataclass(frozen=True)
class MeasurementFile:
    """Every good line of a measurements file, and one :class:`InputError` per bad line (naming line and field)."""

    path: str
    lines: tuple[MeasurementLine, ...]
    errors: tuple[InputError, ...]


def read_measurements(path: str | Path) -> MeasurementFile:
    """Parse a measurements JSONL file line by line; bad lines become errors and the good ones are kept.

    The file itself must be readable (a regular file within ``ampe.io``'s size limit) and hold at most
    :data:`MAX_LINES` lines; otherwise :class:`InputError` is raised."""
    name = str(path)
    text = read_text(path, lenient=True)  # a line that is not UTF-8 costs that line, not the file
    raw_lines = text.splitlines()
    if len(raw_lines) > MAX_LINES:
        raise InputError(name, "", f"{len(raw_lines)} lines; at most {MAX_LINES} measurements are read")
    good: list[MeasurementLine] = []
    errors: list[InputError] = []
    for n, line in enumerate(raw_lines, start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{name}:{n}"
        if undecodable(line):
            errors.append(InputError(where, "", "not UTF-8 text"))
            continue
        try:
            good.append(MeasurementLine(n, Measurement.parse(parse_json(line, where), where)))
        except InputError as e:
            errors.append(e)
    return MeasurementFile(name, tuple(good), tuple(errors))


def measurement_line(m: Measurement) -> str:
    """One JSONL line for ``m`` (what writers append)."""
    import json

    return json.dumps(m.to_json(), sort_keys=True)
