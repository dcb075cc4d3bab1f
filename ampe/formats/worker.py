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


class RankReport(FileModel):
    """One rank's measurements (seconds, bytes, joules)."""

    model_config = _OPEN
    rank: NonNegativeInt
    iteration_s: list[PositiveFloat] = Field(default_factory=list)
    peak_memory_bytes: NonNegativeInt | None = None
    memory_source: Text | None = None
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
    iteration_s: list[PositiveFloat] = Field(default_factory=list)
    iteration_s_mean: PositiveFloat | None = None
    iteration_s_std: NonNegativeFloat | None = None
    peak_memory_bytes_per_rank: list[NonNegativeInt | None] | None = None
    memory_source: Text | None = None
    energy_j_per_iter: NonNegativeFloat | None = None
    energy_source: Text | None = None
    plan_applied: Flag | None = None
    instructions_ok: Flag | None = None
    ranks: list[RankReport] | None = None

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
