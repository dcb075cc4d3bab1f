"""Measurements from anywhere → the same :class:`~ampe.report.compare.Report` a trials folder gives.

``ampe report --measurements FILE.jsonl --cluster SPEC --model M [--profile P]``: each line of the file
(:mod:`ampe.formats.measurement`) is a strategy and what was measured; the cost model predicts every strategy on the
given cluster, model and profile, and the report compares the two (Spearman, MAPE, out-of-memory table, best vs
best). Strategies are ranked by predicted time: the "plan rank" of a measured strategy is its position in that order
(1 = predicted fastest).

A strategy measured on several lines counts once: the mean of its ``ok`` lines' times (largest memory, mean
energy), or, when none ran, the first failure. A bad line — malformed, or a strategy that does not fit the cluster or
model — is reported with its line number and field and left out; every other line is used.
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
from ampe.formats.measurement import Measurement, MeasurementFile
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


@dataclass(frozen=True)
class MeasurementsReport:
    """The report, the strategies it was built from, and the bad lines left out."""

    report: Report
    runs: tuple[MeasuredStrategyRun, ...]
    errors: tuple[InputError, ...]


def measured_runs(mfile: MeasurementFile, num_devices: int, num_layers: int
                  ) -> tuple[list[MeasuredStrategyRun], list[InputError]]:
    """Validate every line's strategy against the cluster size and the model's layers, and merge repeated
    strategies. Returns the distinct strategies (in order of first appearance) and one error per bad line."""
    errors = list(mfile.errors)
    groups: dict[str, list[tuple[int, Strategy, Measurement]]] = {}
    for ml in mfile.lines:
        where = f"{mfile.path}:{ml.line}"
        try:
            s = validate(strategy_from_dict(ml.record.strategy_dict(), where), num_devices, num_layers, where)
        except InputError as e:
            errors.append(InputError(e.source, f"strategy.{e.field}" if e.field else "strategy", e.message))
            continue
        groups.setdefault(_identity(s), []).append((ml.line, s, ml.record))
    runs = []
    for entries in groups.values():
        ok = [m for _, _, m in entries if m.status == "ok"]
        pick = ok or [entries[0][2]]
        mems = [m.peak_memory_bytes for m in pick if m.peak_memory_bytes is not None]
        energies = [m.energy_j for m in pick if m.energy_j is not None]
        runs.append(MeasuredStrategyRun(
            strategy=entries[0][1], lines=tuple(n for n, _, _ in entries), status=pick[0].status,
            iteration_s=statistics.fmean(float(m.iteration_s or 0.0) for m in ok) if ok else None,
            peak_memory_bytes=max(mems) if mems else None,
            energy_j=statistics.fmean(energies) if energies else None,
            iteration_std_s=statistics.pstdev(float(m.iteration_s or 0.0) for m in ok) if len(ok) > 1 else None))
    errors.sort(key=_line_of)
    return runs, errors


def report_from_measurements(mfile: MeasurementFile, cluster: Cluster, model: Model, profile: Profile | None = None,
                             method: str = "eq5") -> MeasurementsReport:
    """Predict every measured strategy (seconds, bytes) and compare; bad lines are returned, not raised.

    Raises :class:`InputError` only when no line is usable."""
    runs, errors = measured_runs(mfile, cluster.size, model.num_layers)
    if not runs:
        first = f" (first: {errors[0]})" if errors else ""
        raise InputError(mfile.path, "", f"no usable measurement line{first}")
    cm = CostModel(cluster, model, profile)
    estimates = [cm.estimate(r.strategy, method) for r in runs]
    order = sorted(range(len(runs)), key=lambda i: (estimates[i].iteration_s, i))
    rank = {i: pos + 1 for pos, i in enumerate(order)}
    rows = [_row(run, est, rank[i]) for i, (run, est) in enumerate(zip(runs, estimates, strict=True))]
    return MeasurementsReport(summarise(rows, None, mfile.path), tuple(runs), tuple(errors))


def _row(run: MeasuredStrategyRun, est: Estimate, rank: int) -> ReportRow:
    s = run.strategy
    lines = ",".join(map(str, run.lines))
    return ReportRow(
        trial_id=f"line {lines}", key=f"line{lines}", plan_rank=rank,
        label=f"pp{s.pp}·dp{s.dp}·tp{s.tp}·mbs{s.mbs}", freq_backend="-", schedule_applied=False,
        status=run.status, reason=None if run.status == "ok" else f"measured {run.status}",
        predicted_s=est.iteration_s, measured_s=run.iteration_s, measured_std_s=run.iteration_std_s,
        predicted_fits=est.fits,
        predicted_memory_bytes=est.max_memory_bytes, measured_memory_bytes=run.peak_memory_bytes,
        memory_source="measured" if run.peak_memory_bytes is not None else None,
        predicted_energy_j=None, energy_j=run.energy_j,
        energy_source="measured" if run.energy_j is not None else None, baseline_key=None,
        strategy=s.to_dict())


def _identity(s: Strategy) -> str:
    d: dict[str, Any] = s.to_dict()
    return json.dumps({k: d.get(k) for k in ("pp", "dp", "tp", "mbs", "gbs", "partition", "placement", "schedule",
                                             "virtual_stages")}, sort_keys=True)


def _line_of(e: InputError) -> int:
    tail = e.source.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else 0
