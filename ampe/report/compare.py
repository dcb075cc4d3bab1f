"""Predicted versus measured: how well the cost model ranked and timed the strategies that really ran.

``build_report(dir) -> Report`` reads a trial results folder (``ampe trial --out DIR``). Figures:

* **Spearman ρ** between predicted and measured iteration time over the measured strategies (AMP's rank-fidelity
  target T9: ≥ 0.5); None with fewer than 3 points or constant values.
* **MAPE** = mean |predicted − measured| / measured × 100 %, and the median measured/predicted ratio (the bias the
  calibration removes).
* **Out of memory**, predicted vs observed: predicted to fit and ran / predicted to fit but OOM'd (the model missed
  it) / predicted not to fit but ran (false alarm) / predicted not to fit and OOM'd / predicted not to fit, not run.
* **Best measured vs best predicted**: the measured time of the planner's top choice, the best measured strategy, the
  ratio between them, and the predicted rank of the measured best (its plan rank, and AMP's 0-based position among
  the measured strategies ordered by prediction).
* AMP's T10 figures: mean ± population std and min over the first 10 measured strategies in predicted order.
* For strategies also run with a frequency schedule: time and energy with and without it, measured and predicted.

One *fidelity row* stands for each strategy: its run without a frequency schedule, or the scheduled run if that is
all there is. Predictions come from ``DIR/plan.json`` when it lists the same strategy (so a recalibrated plan
re-scores old measurements), else from the prediction stored with the trial.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ampe.errors import InputError
from ampe.formats.plan import Caveat
from ampe.formats.trial import TrialResult
from ampe.formats.worker import kernel_mismatch
from ampe.io import exists
from ampe.trials.planfile import TrialPlan, plan_from_dict
from ampe.trials.results import RESULTS_FILE, ResultsStore, json_safe


@dataclass(frozen=True)
class ReportRow:
    """One trial as the report shows it (seconds, bytes, joules per iteration)."""

    trial_id: str
    key: str
    plan_rank: int
    label: str
    freq_backend: str
    schedule_applied: bool
    status: str
    reason: str | None
    predicted_s: float | None
    measured_s: float | None
    measured_std_s: float | None
    predicted_fits: bool | None
    predicted_memory_bytes: int | None
    measured_memory_bytes: int | None
    memory_source: str | None
    predicted_energy_j: float | None
    energy_j: float | None
    energy_source: str | None
    baseline_key: str | None
    strategy: dict[str, Any] = field(default_factory=dict)
    # what differs between the plan and the run: the attention kernel that ran against the planned one, a prediction
    # made again for how it ran (another precision or kernel than the plan entry's), assumed how-it-ran fields
    notes: tuple[str, ...] = ()
    caveats: tuple[Caveat, ...] = ()  # the plan entry's (memory at risk, not runnable)
    measured_reserved_bytes: int | None = None  # the allocator's reserved peak (CUDA), largest rank
    measured_device_used_bytes: int | None = None  # what the process held on the device at its peak, largest rank
    device_used_source: str | None = None
    host_other_cores: float | None = None  # cores other processes kept busy while it ran (the worker's reading)

    @property
    def fits_label(self) -> str:
        """The predicted fit: ``yes``, ``at risk`` (within capacity, not within the reserve), ``no``, or empty."""
        if any(c.kind == "memory_at_risk" for c in self.caveats):
            return "at risk"
        return "" if self.predicted_fits is None else ("yes" if self.predicted_fits else "no")

    @property
    def error_pct(self) -> float | None:
        """(predicted − measured) / measured × 100; negative means the model was optimistic."""
        if self.predicted_s is None or not self.measured_s:
            return None
        return (self.predicted_s - self.measured_s) / self.measured_s * 100.0


@dataclass(frozen=True)
class OomAccounting:
    """Predicted fit versus what happened, counted over strategies."""

    fit_ran: int = 0
    fit_oom: int = 0  # the memory model missed an OOM
    unfit_ran: int = 0  # false alarm
    unfit_oom: int = 0
    unfit_not_run: int = 0
    other_failures: int = 0  # crash / killed / timeout (no memory verdict)
    at_risk_ran: int = 0  # predicted at risk (within capacity, not within the reserve) and ran
    at_risk_oom: int = 0  # … and ran out of memory


@dataclass(frozen=True)
class ScheduleRow:
    """A strategy measured with and without its frequency schedule."""

    plan_rank: int
    label: str
    freq_backend: str
    time_without_s: float
    time_with_s: float
    predicted_time_without_s: float | None
    predicted_time_with_s: float | None
    energy_without_j: float | None
    energy_with_j: float | None
    energy_source: str | None
    predicted_energy_without_j: float | None = None
    predicted_energy_with_j: float | None = None

    @property
    def measured_slowdown(self) -> float:
        """Iteration time with the schedule over without it."""
        return self.time_with_s / self.time_without_s

    @property
    def predicted_slowdown(self) -> float | None:
        """The plan's predicted time ratio, when both predictions exist."""
        if not self.predicted_time_with_s or not self.predicted_time_without_s:
            return None
        return self.predicted_time_with_s / self.predicted_time_without_s

    @property
    def energy_saving_pct(self) -> float | None:
        """Measured (or modelled, see ``energy_source``) (without − with) / without × 100."""
        return _saving(self.energy_without_j, self.energy_with_j)

    @property
    def predicted_energy_saving_pct(self) -> float | None:
        """The plan's predicted saving, when it predicted both energies."""
        return _saving(self.predicted_energy_without_j, self.predicted_energy_with_j)


@dataclass(frozen=True)
class Report:
    """Everything ``ampe report`` prints, plots and calibrates from."""

    directory: str
    rows: tuple[ReportRow, ...]
    fidelity: tuple[ReportRow, ...]  # one per strategy, plan order
    counts: dict[str, int]
    spearman: float | None
    spearman_pvalue: float | None
    mape_pct: float | None
    median_ratio: float | None  # measured / predicted
    oom: OomAccounting
    best_predicted: ReportRow | None
    best_measured: ReportRow | None
    best_measured_position: int | None  # 0-based among measured strategies ordered by predicted time (AMP)
    top10_mean_s: float | None
    top10_std_s: float | None
    top10_min_s: float | None
    schedules: tuple[ScheduleRow, ...]
    energy_sources: tuple[str, ...]
    plan: TrialPlan | None = field(default=None, repr=False)
    assumed: tuple[str, ...] = ()  # what the report assumed for records that do not say how they ran

    @property
    def notes(self) -> tuple[str, ...]:
        """Every row's notes, labelled (kernel mismatches, re-predictions), then what was assumed."""
        return tuple(f"{r.label}: {n}" for r in self.rows for n in r.notes) + self.assumed

    @property
    def measured(self) -> tuple[ReportRow, ...]:
        """Fidelity rows with a measured time."""
        return tuple(r for r in self.fidelity if r.status == "ok")

    @property
    def best_ratio(self) -> float | None:
        """Measured time of the predicted best over the measured best (1.0: the planner's pick was the best)."""
        bp, bm = self.best_predicted, self.best_measured
        if bp is None or bm is None or bp.measured_s is None or not bm.measured_s:
            return None
        return bp.measured_s / bm.measured_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (``ampe report --json``)."""
        def row(r: ReportRow | None) -> dict | None:
            return None if r is None else {**r.__dict__, "error_pct": r.error_pct}

        return json_safe({
            "schema": "ampe.report/1", "directory": self.directory, "counts": self.counts,
            "spearman": self.spearman, "spearman_pvalue": self.spearman_pvalue, "mape_pct": self.mape_pct,
            "median_ratio": self.median_ratio, "oom": self.oom.__dict__,
            "best_predicted": row(self.best_predicted), "best_measured": row(self.best_measured),
            "best_measured_position": self.best_measured_position, "best_ratio": self.best_ratio,
            "top10": {"mean_s": self.top10_mean_s, "std_s": self.top10_std_s, "min_s": self.top10_min_s},
            "schedules": [{**s.__dict__, "measured_slowdown": s.measured_slowdown,
                           "predicted_slowdown": s.predicted_slowdown, "energy_saving_pct": s.energy_saving_pct,
                           "predicted_energy_saving_pct": s.predicted_energy_saving_pct}
                          for s in self.schedules],
            "energy_sources": list(self.energy_sources),
            "notes": list(self.notes),
            "trials": [row(r) for r in self.rows],
        })


def build_report(directory: str | Path) -> Report:
    """Read a results folder and compute the report. Raises InputError when it holds no trial results."""
    d = Path(directory)
    if not exists(d / RESULTS_FILE):
        raise InputError(str(d), RESULTS_FILE, "not found: not an `ampe trial --out` folder (or no trial finished)")
    latest = list(ResultsStore(d).latest().values())
    plan = _plan_copy(d)
    return report_from_results(latest, plan, str(d))


def report_from_results(results: Sequence[TrialResult], plan: TrialPlan | None = None,
                        directory: str = "") -> Report:
    """The report for given trial results (latest record per key) and, optionally, the current plan. A trial that
    ran in another precision or attention kernel than its plan entry was costed with (a CPU trial of a bf16 plan
    runs fp32) is predicted again for how it ran, when the plan's cluster spec can be read."""
    predictions = _plan_predictions(plan)
    ran = [r for r in results if r.status != "skipped"]
    rows = [_row(r, predictions) for r in ran]
    unnamed = [r for r in ran if not (r.strategy.get("attention") and r.strategy.get("dtype"))]
    assumed = [f"{len(unnamed)} trial record(s) do not name their attention kernel or precision (written before ampe "
               f"recorded them, e.g. {unnamed[0].trial_id}): compared with the prediction as stored; ampe's worker "
               "then ran eager attention whatever the plan said"] if unnamed else []
    return summarise(_as_ran(rows, plan, predictions), plan, directory, assumed)


def summarise(report_rows: Sequence[ReportRow], plan: TrialPlan | None = None, directory: str = "",
              assumed: Sequence[str] = ()) -> Report:
    """The report's figures over ``report_rows`` (trials, or imported measurements with their predictions)."""
    rows = sorted(report_rows, key=lambda r: (r.plan_rank, r.schedule_applied, r.trial_id))
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    fidelity = _fidelity_rows(rows)
    measured = [r for r in fidelity if r.status == "ok" and r.predicted_s and r.measured_s]
    pred = [float(r.predicted_s or 0.0) for r in measured]  # never 0: `measured` keeps rows with both figures
    meas = [float(r.measured_s or 0.0) for r in measured]
    rho, pval = spearman(pred, meas)
    best_pred = min(fidelity, key=lambda r: r.plan_rank, default=None)
    best_meas = min(measured, key=lambda r: float(r.measured_s or 0.0), default=None)
    position = None
    if best_meas is not None:
        by_pred = sorted(measured, key=lambda r: (float(r.predicted_s or 0.0), r.plan_rank))
        position = by_pred.index(best_meas)
    top = [float(r.measured_s or 0.0) for r in sorted(measured, key=lambda r: r.plan_rank)[:10]]
    sources = sorted({r.energy_source for r in rows if r.energy_source})
    return Report(
        directory=directory, rows=tuple(rows), fidelity=tuple(fidelity), counts=counts,
        spearman=rho, spearman_pvalue=pval, mape_pct=mape(pred, meas),
        median_ratio=statistics.median(m / p for p, m in zip(pred, meas, strict=False)) if measured else None,
        oom=_oom(fidelity, plan), best_predicted=best_pred, best_measured=best_meas,
        best_measured_position=position,
        top10_mean_s=statistics.fmean(top) if top else None,
        top10_std_s=statistics.pstdev(top) if top else None,
        top10_min_s=min(top) if top else None,
        schedules=tuple(_schedules(rows)), energy_sources=tuple(sources), plan=plan, assumed=tuple(assumed))


def spearman(predicted: Sequence[float], measured: Sequence[float]) -> tuple[float | None, float | None]:
    """Spearman rank correlation and its p-value; (None, None) below 3 points or for constant inputs."""
    if len(predicted) < 3 or len(set(predicted)) == 1 or len(set(measured)) == 1:
        return None, None
    from scipy.stats import spearmanr

    res = spearmanr(predicted, measured)
    rho, p = float(res.statistic), float(res.pvalue)
    return (None, None) if math.isnan(rho) else (rho, p)


def mape(predicted: Sequence[float] | np.ndarray, measured: Sequence[float] | np.ndarray) -> float | None:
    """Mean absolute percentage error of predictions relative to measurements, in percent."""
    if len(measured) == 0:
        return None
    return float(statistics.fmean(abs(p - m) / m for p, m in zip(predicted, measured, strict=False)) * 100.0)


def plot_report(report: Report, path: str | Path) -> None:
    """Scatter plot PNG (640×640) of predicted vs measured iteration time (seconds) with the y = x line; points are
    labelled with their plan rank, scheduled runs drawn as triangles (:func:`ampe.viz.predicted_vs_measured_plot`)."""
    from ampe.viz import MeasuredPoint, predicted_vs_measured_plot

    rho = "n/a" if report.spearman is None else f"{report.spearman:.2f}"
    err = "n/a" if report.mape_pct is None else f"{report.mape_pct:.1f} %"
    predicted_vs_measured_plot(
        path, [MeasuredPoint(r.predicted_s, r.measured_s, str(r.plan_rank), r.schedule_applied) for r in report.rows
               if r.status == "ok" and r.predicted_s and r.measured_s],
        f"predicted vs measured ({len(report.measured)} strategies)\nSpearman ρ = {rho}, MAPE = {err}")


def _saving(without: float | None, with_: float | None) -> float | None:
    if without is None or with_ is None or not without:
        return None
    return (without - with_) / without * 100.0


def _row(r: TrialResult, predictions: dict[str, _Planned]) -> ReportRow:
    rank, pred = r.plan_rank, r.predicted_iteration_s
    current = predictions.get(_strategy_id(r.strategy))
    if current is not None:
        rank, pred = current.rank, current.sched_s if r.schedule_applied and current.sched_s else current.plain_s
    kernels = r.worker.get("attention_kernels") if isinstance(r.worker, dict) else None
    note = kernel_mismatch(r.strategy.get("attention"), [str(k) for k in kernels] if isinstance(kernels, list)
                           else [])
    notes: tuple[str, ...] = (note,) if note else ()
    planned = r.strategy.get("expandable_segments")
    ran = r.worker.get("expandable_segments", planned)  # older records: no read-back
    if planned is not None and ran != planned:
        notes += (f"planned expandable_segments {planned}, the allocator ran with {ran} (PYTORCH_CUDA_ALLOC_CONF "
                  f"{r.worker.get('allocator_settings')!r})",)
    return ReportRow(
        trial_id=r.trial_id, key=r.key, plan_rank=rank, label=r.label(), freq_backend=r.freq_backend,
        schedule_applied=r.schedule_applied, status=r.status, reason=r.reason, predicted_s=pred,
        measured_s=r.iteration_s_mean if r.status == "ok" else None,
        measured_std_s=r.iteration_s_std if r.status == "ok" else None, predicted_fits=r.predicted_fits,
        predicted_memory_bytes=r.predicted_max_memory_bytes, measured_memory_bytes=r.peak_memory_bytes,
        memory_source=r.memory_source, predicted_energy_j=r.predicted_energy_j, energy_j=r.energy_j_per_iter,
        energy_source=r.energy_source, baseline_key=r.baseline_key, strategy=dict(r.strategy),
        notes=notes, caveats=r.predicted_caveats, measured_reserved_bytes=r.peak_reserved_bytes,
        measured_device_used_bytes=r.peak_device_used_bytes, device_used_source=r.device_used_source,
        host_other_cores=_other_cores(r))


def _other_cores(r: TrialResult) -> float | None:
    value = r.worker.get("host_other_cores") if isinstance(r.worker, dict) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _as_ran(rows: list[ReportRow], plan: TrialPlan | None, predictions: dict[str, _Planned]) -> list[ReportRow]:
    """``rows`` with the ones that ran another precision or attention kernel than their plan entry predicted again
    on that variant of the plan's model (schedules keep the plan's figures: they were planned for the entry)."""
    if plan is None or not plan.cluster_spec:
        return rows
    named = []
    for i, r in enumerate(rows):
        entry = predictions.get(_strategy_id(r.strategy))
        if entry is not None and r.strategy.get("attention") and r.strategy.get("dtype") and not r.schedule_applied:
            named.append((i, entry))
    if not named:
        return rows
    from dataclasses import replace

    from ampe.costmodel.cluster import load_cluster
    from ampe.costmodel.estimate import CostModel
    from ampe.costmodel.strategy import strategy_from_dict
    from ampe.costmodel.zoo import load_model

    try:
        # its kernel and precision: what an entry naming none was
        model = load_model(plan.model, plan.attention, seq_len=plan.seq_len,
                           seq_len_from=(plan.source, "inputs.seq_len"))
        todo = [(i, e) for i, e in named if (rows[i].strategy["attention"], rows[i].strategy["dtype"])
                != (e.costed[0] or model.attention, e.costed[1] or model.dtype)]
        if not todo:
            return rows
        cluster = load_cluster(plan.cluster_spec)
        cm = CostModel(cluster, *plan.cost_inputs(cluster))
    except InputError as e:
        return [replace(r, notes=(*r.notes, f"not predicted again for how it ran ({e})")) if any(i == j for j, _ in
                named) else r for i, r in enumerate(rows)]
    out = list(rows)
    for i, entry in todo:
        r = rows[i]
        est = cm.estimate(strategy_from_dict(r.strategy, plan.source))
        was = f"{entry.costed[0] or model.attention}/{entry.costed[1] or model.dtype}"
        now = "/".join(str(r.strategy.get(k)) for k in ("attention", "dtype"))
        caveats = tuple(c for c in r.caveats if c.kind != "memory_at_risk") + est.caveats
        out[i] = replace(r, predicted_s=est.iteration_s, predicted_fits=est.fits,
                         predicted_memory_bytes=est.max_memory_bytes, caveats=caveats,
                         notes=(*r.notes, f"ran {now}, the plan costed {was}: predicted again as it ran"))
    return out


def _fidelity_rows(rows: list[ReportRow]) -> list[ReportRow]:
    by_rank: dict[int, ReportRow] = {}
    for r in rows:
        if r.status == "interrupted":
            continue
        cur = by_rank.get(r.plan_rank)
        if cur is None or (cur.schedule_applied and not r.schedule_applied):
            by_rank[r.plan_rank] = r
    return [by_rank[k] for k in sorted(by_rank)]


def _oom(fidelity: list[ReportRow], plan: TrialPlan | None) -> OomAccounting:
    c = dict.fromkeys(("fit_ran", "fit_oom", "unfit_ran", "unfit_oom", "unfit_not_run", "other_failures",
                       "at_risk_ran", "at_risk_oom"), 0)
    for r in fidelity:
        verdict = {"at risk": "at_risk", "no": "unfit"}.get(r.fits_label, "fit")
        if r.status == "ok":
            c[f"{verdict}_ran"] += 1
        elif r.status == "oom":
            c[f"{verdict}_oom"] += 1
        else:
            c["other_failures"] += 1
    if plan is not None:
        ran = {r.plan_rank for r in fidelity}
        c["unfit_not_run"] = sum(1 for p in plan.strategies if not p.within_capacity and p.rank not in ran)
    return OomAccounting(**c)


def _schedules(rows: list[ReportRow]) -> list[ScheduleRow]:
    by_key = {r.key: r for r in rows}
    out = []
    for r in rows:
        base = by_key.get(r.baseline_key) if r.schedule_applied and r.baseline_key else None
        if base is None or r.status != "ok" or base.status != "ok" or base.measured_s is None \
                or r.measured_s is None:
            continue
        src = r.energy_source if r.energy_source == base.energy_source else "mixed: " + ", ".join(
            str(s) for s in (base.energy_source, r.energy_source))
        out.append(ScheduleRow(plan_rank=r.plan_rank, label=r.label, freq_backend=r.freq_backend,
                               time_without_s=base.measured_s, time_with_s=r.measured_s,
                               predicted_time_without_s=base.predicted_s, predicted_time_with_s=r.predicted_s,
                               energy_without_j=base.energy_j, energy_with_j=r.energy_j, energy_source=src,
                               predicted_energy_without_j=base.predicted_energy_j,
                               predicted_energy_with_j=r.predicted_energy_j))
    return out


def _strategy_id(s: dict[str, Any]) -> str:
    """A strategy's layout and memory options (the defaults where a record leaves them out)."""
    keys = ("pp", "dp", "tp", "mbs", "gbs", "partition", "placement", "schedule")
    ident: dict[str, Any] = {k: s.get(k) for k in keys}
    ident.update(recompute=s.get("recompute") or "none", stage_recompute=s.get("stage_recompute"),
                 zero=s.get("zero") or 0)
    return json.dumps(ident, sort_keys=True)


@dataclass(frozen=True)
class _Planned:
    """What the current plan says of one strategy."""

    rank: int
    plain_s: float
    sched_s: float | None
    costed: tuple[str | None, str | None]  # the (attention, dtype) its prediction is for


def _plan_predictions(plan: TrialPlan | None) -> dict[str, _Planned]:
    """Strategy identity → what the current plan predicted for it."""
    if plan is None:
        return {}
    out = {}
    for p in plan.strategies:
        s = p.strategy
        fp = p.frequency_plan
        out[_strategy_id(s.to_dict())] = _Planned(p.rank, p.predicted.iteration_s,
                                                  fp.time_s if fp is not None else None,
                                                  (s.attention or plan.attention, s.dtype))
    return out


def _plan_copy(d: Path) -> TrialPlan | None:
    path = d / "plan.json"
    if not exists(path):
        return None
    from ampe.io import read_json

    return plan_from_dict(read_json(path), str(path), base_dir=d)

