"""Measurements from anywhere → the same :class:`~ampe.report.compare.Report` a trials folder gives.

``ampe report --measurements FILE.jsonl --cluster SPEC --model M [--profile P]``: each line of the file
(:mod:`ampe.formats.measurement`) is a strategy and what was measured; the cost model predicts every strategy on the
given cluster, model and profile, and the report compares the two (Spearman, MAPE, out-of-memory table, best vs
best). Strategies are ranked by predicted time: the "plan rank" of a measured strategy is its position in that order
(1 = predicted fastest).

A strategy measured on several lines counts once: the mean of its ``ok`` lines' times (largest memory, mean
energy), or, when none ran, the first failure; the same layout run with other memory options, another attention
kernel or precision is another strategy. A bad line — malformed, or a strategy that does not fit the cluster or
model — is reported with its line number and field and left out; every other line is used.

Every strategy is predicted as it ran: its recomputation (per stage), ZeRO stage, attention kernel and precision
(:meth:`ampe.costmodel.estimate.CostModel.for_strategy`). A line that leaves them out (older files) is predicted with
no recomputation, no ZeRO and the model's own kernel and precision, and the report says so
(:attr:`MeasurementsReport.assumed`).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import Any

from ampe.costmodel.cluster import Cluster
from ampe.costmodel.estimate import CostModel, Estimate
from ampe.costmodel.model import Model
from ampe.costmodel.profile import Profile
from ampe.costmodel.strategy import Strategy, strategy_from_dict, validate
from ampe.errors import InputError
from ampe.formats.measurement import RUN_FIELDS, Measurement, MeasurementFile
from ampe.formats.trial import strategy_label
from ampe.report.compare import Report, ReportRow, summarise


@dataclass(frozen=True)
class MeasuredStrategyRun:
    """One distinct measured strategy: its merged measurement and the lines it came from."""

    strategy: Strategy
    lines: tuple[int, ...]
    status: str  # "ok" | "oom" | "failed"
    iteration_s: float | None
    peak_memory_bytes: int | None
    energy_j: float | None
    iteration_std_s: float | None = None  # population std of the ok lines' times, when two or more
    energy_source: str | None = None  # nvml | measured | modelled, or "mixed (…)" across lines; None without energy
    frozen_layers: int = 0  # the first N layers trained frozen (predicted so)


@dataclass(frozen=True)
class MeasurementsReport:
    """The report, the strategies it was built from, and the bad lines left out."""

    report: Report
    runs: tuple[MeasuredStrategyRun, ...]
    errors: tuple[InputError, ...]
    assumed: tuple[str, ...] = ()  # what was assumed for lines that do not say how they ran (one sentence each)


def measured_runs(mfile: MeasurementFile, num_devices: int, num_layers: int
                  ) -> tuple[list[MeasuredStrategyRun], list[InputError]]:
    """Validate every line's strategy against the cluster size and the model's layers, and merge repeated
    strategies. Returns the distinct strategies (in order of first appearance) and one error per bad line."""
    errors = list(mfile.errors)
    groups: dict[str, list[tuple[int, Strategy, Measurement]]] = {}
    for ml in mfile.lines:
        where = f"{mfile.path}:{ml.line}"
        try:
            s = strategy_from_dict(ml.record.strategy_dict(), where)
            # a strategy on some of the devices names them (a placement: `search --devices auto`, a re-plan down to
            # fewer replicas) and is scored on the cluster as given; without one it ran on another cluster
            if s.world_size != num_devices and s.placement is None:
                raise InputError(where, "pp·dp·tp", f"{s.pp}·{s.dp}·{s.tp} = {s.world_size} devices ran, but the "
                                 f"cluster has {num_devices}; give the line's placement (the devices it ran on) or "
                                 "--cluster a spec of those devices")
            s = validate(s, num_devices, num_layers, where)
            frozen = ml.record.strategy.frozen_layers or 0
            if frozen > num_layers:
                raise InputError(where, "frozen_layers", f"{frozen} frozen layers but the model has {num_layers}")
        except InputError as e:
            errors.append(InputError(e.source, f"strategy.{e.field}" if e.field else "strategy", e.message))
            continue
        groups.setdefault(f"{frozen}:{_identity(s)}", []).append((ml.line, s, ml.record))
    runs = []
    for entries in groups.values():
        ok = [m for _, _, m in entries if m.status == "ok"]
        pick = ok or [entries[0][2]]
        mems = [m.peak_memory_bytes for m in pick if m.peak_memory_bytes is not None]
        energies = [m.energy_j for m in pick if m.energy_j is not None]
        sources = sorted({m.energy_source or "measured" for m in pick if m.energy_j is not None})
        runs.append(MeasuredStrategyRun(
            strategy=entries[0][1], lines=tuple(n for n, _, _ in entries), status=pick[0].status,
            iteration_s=statistics.fmean(float(m.iteration_s or 0.0) for m in ok) if ok else None,
            peak_memory_bytes=max(mems) if mems else None,
            energy_j=statistics.fmean(energies) if energies else None,
            iteration_std_s=statistics.pstdev(float(m.iteration_s or 0.0) for m in ok) if len(ok) > 1 else None,
            energy_source=None if not sources else sources[0] if len(sources) == 1 else
            f"mixed ({', '.join(sources)})", frozen_layers=entries[0][2].strategy.frozen_layers or 0))
    errors.sort(key=_line_of)
    return runs, errors


def report_from_measurements(mfile: MeasurementFile, cluster: Cluster, model: Model, profile: Profile | None = None,
                             method: str = "eq5") -> MeasurementsReport:
    """Predict every measured strategy (seconds, bytes) as it ran and compare; bad lines are returned, not raised.

    Raises :class:`InputError` only when no line is usable."""
    runs, errors = measured_runs(mfile, cluster.size, model.num_layers)
    models = {k: CostModel(cluster, model.with_frozen_prefix(k) if k else model, profile)
              for k in {r.frozen_layers for r in runs}}
    kept, estimates = [], []
    for r in runs:
        try:
            estimates.append(models[r.frozen_layers].estimate(r.strategy, method))
        except ValueError as e:  # a variant of the model that cannot be built (e.g. eager from a flash-only YAML)
            errors.append(InputError(f"{mfile.path}:{r.lines[0]}", "strategy", str(e)))
            continue
        kept.append(r)
    runs = kept
    if not runs:
        first = f" (first: {errors[0]})" if errors else ""
        raise InputError(mfile.path, "", f"no usable measurement line{first}")
    errors.sort(key=_line_of)
    order = sorted(range(len(runs)), key=lambda i: (estimates[i].iteration_s, i))
    rank = {i: pos + 1 for pos, i in enumerate(order)}
    rows = [_row(run, est, rank[i]) for i, (run, est) in enumerate(zip(runs, estimates, strict=True))]
    tf32_matters = any(g.peak_flops_tf32 is not None for g in cluster.gpu_types())
    assumed = assumed_fields(mfile, model, {n for r in runs for n in r.lines}, tf32_matters)
    return MeasurementsReport(summarise(rows, None, mfile.path, assumed), tuple(runs), tuple(errors), assumed)


def assumed_fields(mfile: MeasurementFile, model: Model, used: set[int] | None = None,
                   tf32_matters: bool = True) -> tuple[str, ...]:
    """One sentence per how-it-ran field that some of the ``used`` lines (default: every good line) leave out,
    naming the lines and what was assumed; ``tf32`` only where it matters (``tf32_matters``: some GPU type of the
    cluster has TF32 tensor cores)."""
    defaults = {"recompute": "none", "zero": "0 (no ZeRO)", "attention": f"{model.attention} (the model's)",
                "dtype": f"{model.dtype} (the model's)",
                "tf32": f"{'on' if model.tf32 else 'off'} (the model's; PyTorch's default is off)"}
    missing: dict[str, list[int]] = {}
    for ml in mfile.lines:
        if used is not None and ml.line not in used:
            continue
        for key in ml.record.strategy.unnamed():
            if key != "tf32" or tf32_matters:
                missing.setdefault(key, []).append(ml.line)
    out = []
    for key in RUN_FIELDS:
        lines = missing.get(key)
        if lines:
            shown = ",".join(map(str, lines[:5])) + (f" and {len(lines) - 5} more" if len(lines) > 5 else "")
            out.append(f"{len(lines)} line(s) do not name {key} (line {shown}): assumed {defaults[key]}")
    return tuple(out)


def _row(run: MeasuredStrategyRun, est: Estimate, rank: int) -> ReportRow:
    s = run.strategy
    lines = ",".join(map(str, run.lines))
    return ReportRow(
        trial_id=f"line {lines}", key=f"line{lines}", plan_rank=rank,
        label=strategy_label(s.to_dict()), freq_backend="-", schedule_applied=False,
        status=run.status, reason=None if run.status == "ok" else f"measured {run.status}",
        predicted_s=est.iteration_s, measured_s=run.iteration_s, measured_std_s=run.iteration_std_s,
        predicted_fits=est.fits,
        predicted_memory_bytes=est.max_memory_bytes, measured_memory_bytes=run.peak_memory_bytes,
        memory_source="measured" if run.peak_memory_bytes is not None else None,
        predicted_energy_j=None, energy_j=run.energy_j,
        energy_source=run.energy_source if run.energy_j is not None else None, baseline_key=None,
        strategy={**s.to_dict(), **({"frozen_layers": run.frozen_layers} if run.frozen_layers else {})})


def _identity(s: Strategy) -> str:
    """Layout and how it ran (``gas`` follows from the rest)."""
    d: dict[str, Any] = s.to_dict()
    d.pop("gas", None)
    return json.dumps(d, sort_keys=True)


def _line_of(e: InputError) -> int:
    tail = e.source.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else 0
