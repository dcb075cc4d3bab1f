"""``ampe.trial/1``: one trial's record — a line of ``results.jsonl`` in a trials folder (``ampe trial --out DIR``),
written by the trial runner and read by ``ampe report`` and resumed runs, both with :class:`TrialResult`."""

from __future__ import annotations

import statistics
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from ampe.errors import InputError
from ampe.formats._base import (
    FileModel,
    Flag,
    IterationSeconds,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    Text,
)
from ampe.formats.plan import Caveat

TRIAL_SCHEMA = "ampe.trial/1"
#: Trial states. ``ok`` ran and measured; ``oom``/``crash``/``killed``/``timeout`` failed for that reason;
#: ``interrupted`` was stopped by the user (rerun on resume); ``skipped`` never started (budget, unrealizable).
STATUSES = ("ok", "oom", "crash", "killed", "timeout", "interrupted", "skipped")
#: A resume does not rerun these (``--retry-failed`` reruns all but ok and oom).
FINISHED = frozenset({"ok", "oom", "crash", "killed", "timeout"})
Status = Literal["ok", "oom", "crash", "killed", "timeout", "interrupted", "skipped"]


class TrialResult(FileModel):
    """One trial: what ran, what the cost model predicted, and what was measured (seconds, bytes, joules).

    ``energy_source`` says where ``energy_j_per_iter`` came from: ``"nvml"`` (measured) or a string starting with
    ``"modelled"`` (no energy counter; a model, never a measurement). ``baseline_key`` links a trial that ran a
    frequency schedule to its twin without one (the time and energy "without the schedule")."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, populate_by_name=True)

    schema_: Literal["ampe.trial/1"] = Field(default="ampe.trial/1", alias="schema")
    key: Text
    trial_id: Text
    plan_rank: PositiveInt
    strategy: dict[str, Any]
    model: Text
    cluster: Text
    freq_backend: Text
    schedule_applied: Flag
    warmup_iters: NonNegativeInt
    timed_iters: NonNegativeInt
    status: Status
    reason: str | None = None
    predicted_iteration_s: IterationSeconds | None = None
    predicted_max_memory_bytes: NonNegativeInt | None = None
    predicted_fits: Flag | None = None
    # the plan entry's caveats (memory at risk: ``predicted_fits`` is then false though it is within capacity)
    predicted_caveats: tuple[Caveat, ...] = Field(default=(), fail_fast=True)
    predicted_energy_j: NonNegativeFloat | None = None
    iteration_s: tuple[IterationSeconds, ...] = Field(default=(), fail_fast=True)
    iteration_s_mean: IterationSeconds | None = None
    iteration_s_std: NonNegativeFloat | None = None
    # per rank: the allocated peak (torch.cuda.max_memory_allocated; CPU: the worker's tensor trace), the caching
    # allocator's reserved peak (torch.cuda.max_memory_reserved; None on CPU: no caching allocator) and what the
    # process held on the device at its peak (``device_used_source`` says how it was read)
    peak_memory_bytes_per_rank: tuple[NonNegativeInt | None, ...] = Field(default=(), fail_fast=True)
    memory_source: Text | None = None
    peak_reserved_bytes_per_rank: tuple[NonNegativeInt | None, ...] = Field(default=(), fail_fast=True)
    peak_device_used_bytes_per_rank: tuple[NonNegativeInt | None, ...] = Field(default=(), fail_fast=True)
    device_used_source: Text | None = None
    energy_j_per_iter: NonNegativeFloat | None = None
    energy_source: Text | None = None
    plan_applied: Flag | None = None
    instructions_ok: Flag | None = None
    baseline_key: Text | None = None
    failed_rank: NonNegativeInt | None = None
    wall_s: NonNegativeFloat = 0.0
    started_at: str = ""
    job_dir: str = ""
    worker: dict[str, Any] = Field(default_factory=dict)  # other fields the worker reported (e.g. "emulated")

    @model_validator(mode="after")
    def _mean_of_samples(self) -> TrialResult:
        if self.iteration_s and self.iteration_s_mean is not None:
            mean = statistics.fmean(self.iteration_s)
            if abs(self.iteration_s_mean - mean) > 1e-6 * mean:
                raise ValueError(f"iteration_s_mean: {self.iteration_s_mean:g} s, but its {len(self.iteration_s)} "
                                 f"iteration_s samples average {mean:g} s; the record contradicts itself")
        return self

    @property
    def finished(self) -> bool:
        """True when a resume should not run this trial again."""
        return self.status in FINISHED

    @property
    def energy_measured(self) -> bool:
        """True only for an energy counter reading (NVML); modelled energy is never a measurement."""
        return self.energy_source == "nvml"

    @property
    def peak_memory_bytes(self) -> int | None:
        """Largest allocated peak over ranks, or None when no rank reported one."""
        return _largest(self.peak_memory_bytes_per_rank)

    @property
    def peak_reserved_bytes(self) -> int | None:
        """Largest reserved peak over ranks, or None when no rank reported one."""
        return _largest(self.peak_reserved_bytes_per_rank)

    @property
    def peak_device_used_bytes(self) -> int | None:
        """Largest device-used peak over ranks, or None when no rank reported one."""
        return _largest(self.peak_device_used_bytes_per_rank)

    @property
    def shares(self) -> tuple[int, ...]:
        """Micro-batches per iteration of each data-parallel replica as the trial ran: the strategy's ``replica_gas``,
        else ``gas`` each (every record written before uneven shares ran equal ones)."""
        return record_shares(self.strategy)

    def label(self) -> str:
        """Short human name, e.g. ``pp2·dp1·tp1·mbs2`` (:func:`strategy_label`)."""
        return strategy_label(self.strategy)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready record (one line of results.jsonl), every field included."""
        return self.model_dump(mode="json", by_alias=True)


def _largest(values: tuple[int | None, ...]) -> int | None:
    vals = [m for m in values if m is not None]
    return max(vals) if vals else None


def record_shares(s: dict[str, Any]) -> tuple[int, ...]:
    """Each replica's micro-batches of a strategy record: ``replica_gas``, else equal shares (``gas``, or gbs/(dp·mbs),
    per replica)."""
    per = s.get("replica_gas")
    if per:
        return tuple(int(g) for g in per)
    dp = int(s.get("dp") or 1)
    gas = s.get("gas") or int(s.get("gbs") or 0) // (dp * int(s.get("mbs") or 1))
    return (int(gas),) * dp


def strategy_label(s: dict[str, Any]) -> str:
    """Short human name of a strategy record, e.g. ``pp2·dp1·tp1·mbs2``, with uneven shares when it has them
    (``…·mbs1·shares5:3``), its memory options when it has any (``pp2·dp2·tp1·mbs2·zero1·full``) and its attention
    kernel when the record names one (``…·flash``)."""
    out = f"pp{s.get('pp')}·dp{s.get('dp')}·tp{s.get('tp')}·mbs{s.get('mbs')}"
    if s.get("replica_gas"):
        out += "·shares" + ":".join(str(g) for g in s["replica_gas"])
    if s.get("zero"):
        out += f"·zero{s['zero']}"
    per = s.get("stage_recompute")
    if isinstance(per, list) and per:
        out += "·" + "/".join(str(r) for r in per)
    elif s.get("recompute") not in (None, "none"):
        out += f"·{s['recompute']}"
    if s.get("attention"):
        out += f"·{s['attention']}"
    return out


def result_from_dict(d: Any, source: str = "results.jsonl", where: str = "") -> TrialResult:
    """Parse one record written by :meth:`TrialResult.to_dict`. Raises InputError naming the file and the field."""
    if not isinstance(d, dict) or d.get("schema") != TRIAL_SCHEMA:
        raise InputError(source, where or "(record)", f"not an {TRIAL_SCHEMA} record")
    return TrialResult.parse(d, source, where)
