"""What a trial's ranks write for the runner (contract in docs/trials.md), each written and read with one model:

* ``rank{R}.json`` — :class:`RankReport`, one rank's measurements;
* ``result.json`` — :class:`WorkerResult`, rank 0's aggregate of every rank (the trial's outcome when it is ``ok``);
* ``error_rank{R}.json`` — :class:`WorkerError`, why a rank failed (``oom`` or ``crash``);
* ``progress.json`` — :class:`Progress`, the iteration rank 0 is at.

The named fields are the ones the runner reads; a worker may add more (kept in the trial record's ``worker``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from ampe.formats._base import FileModel, Flag, NonNegativeFloat, NonNegativeInt, PositiveFloat, Text

_OPEN = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)

#: Values of a rank report's ``attention_kernel``: the written-out form, or the kernel torch chose behind SDPA
ATTENTION_KERNELS = ("eager", "sdpa-flash", "sdpa-mem-efficient", "sdpa-cudnn", "sdpa-math")
#: kernels that keep no s² scores for backward (what the cost model's ``flash`` attention assumes); ``sdpa-math``
#: writes the scores out as eager attention does
NO_SCORE_KERNELS = frozenset({"sdpa-flash", "sdpa-mem-efficient", "sdpa-cudnn"})


def kernel_attention(kernel: str) -> str:
    """The cost model's attention (``flash``: no s² scores kept; ``eager``: scores kept) of a kernel that ran."""
    return "flash" if kernel in NO_SCORE_KERNELS else "eager"


def kernel_mismatch(planned: str | None, kernels: list[str] | tuple[str, ...]) -> str | None:
    """Why the kernels that ran are not the ``planned`` attention (a sentence), or None when they are, or when
    either is unknown."""
    if planned is None or not kernels:
        return None
    wrong = sorted(k for k in kernels if kernel_attention(k) != planned)
    if not wrong:
        return None
    what = "keeps the s² scores" if planned == "flash" else "keeps no s² scores"
    return f"planned {planned} attention, but {', '.join(wrong)} ran ({what}: memory and time differ from the plan)"


class RankReport(FileModel):
    """One rank's measurements (seconds, bytes, joules)."""

    model_config = _OPEN
    rank: NonNegativeInt
    iteration_s: list[PositiveFloat] = Field(default_factory=list, fail_fast=True)
    peak_memory_bytes: NonNegativeInt | None = None
    memory_source: Text | None = None
    peak_reserved_bytes: NonNegativeInt | None = None  # torch.cuda.max_memory_reserved (None on CPU)
    peak_device_used_bytes: NonNegativeInt | None = None  # what the process held on the device at its peak
    device_used_source: Text | None = None  # how that was read
    energy_j: NonNegativeFloat | None = None
    energy_source: Text | None = None
    instructions_ok: Flag | None = None
    instruction_mismatch: str | None = None
    plan_applied: Flag | None = None
    emulated: dict[str, Any] | None = None
    host: Text | None = None


class WorkerResult(FileModel):
    """Rank 0's ``result.json``: per-iteration time is the slowest rank's."""

    model_config = _OPEN
    status: Literal["ok"]
    iteration_s: list[PositiveFloat] = Field(default_factory=list, fail_fast=True)
    iteration_s_mean: PositiveFloat | None = None
    iteration_s_std: NonNegativeFloat | None = None
    peak_memory_bytes_per_rank: list[NonNegativeInt | None] | None = Field(default=None, fail_fast=True)
    memory_source: Text | None = None
    peak_reserved_bytes_per_rank: list[NonNegativeInt | None] | None = Field(default=None, fail_fast=True)
    peak_device_used_bytes_per_rank: list[NonNegativeInt | None] | None = Field(default=None, fail_fast=True)
    device_used_source: Text | None = None
    energy_j_per_iter: NonNegativeFloat | None = None
    energy_source: Text | None = None
    plan_applied: Flag | None = None
    instructions_ok: Flag | None = None
    ranks: list[RankReport] | None = Field(default=None, fail_fast=True)

    def extras(self) -> dict[str, Any]:
        """The worker's other figures (every field not named above)."""
        return dict(self.model_extra or {})


class WorkerError(FileModel):
    """Why a rank failed."""

    model_config = _OPEN
    kind: Literal["oom", "crash"] = "crash"
    message: str = ""
    traceback: str = ""


class Progress(FileModel):
    """Rank 0's progress through the trial."""

    model_config = _OPEN
    iteration: NonNegativeInt
    of: NonNegativeInt
    phase: Text = ""
