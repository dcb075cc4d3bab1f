"""Close the loop: measured strategies → a structurally calibrated cost model for the next search.

Measured iteration times (a trials folder, or any measurements file) fit the cost-model parameters the data can
identify, regularised toward the uncalibrated model (a Gaussian prior on each, in log space for factors)::

    compute_factor[type]   per-layer compute time × factor                          prior 1, sd e^±1
    mbs_exponent η         per-layer time × mbs^(−η): utilisation gains at large mbs  prior 0, sd 0.5
    pipeline_op_s[type]    fixed seconds per pipeline instruction (forward, backward)  prior: the catalog's, sd 5 ms
    link_efficiency[class] achieved fraction of intra-/inter-node bandwidth           prior 1, sd e^±1, at most 1
                           for pipeline sends and gradient all-reduces

The fit minimises Σ (log estimate − log measured)² / σ² + Σ ((θ − θ₀) / σ₀)² with σ = 5 % (scipy's
``least_squares``): the maximum a posteriori estimate. Directions the data cannot see stay at the prior. A parameter
is reported as *fitted* (identified) when the selected structure moves it and the measurements shrink its posterior
standard deviation (Gauss–Newton at the optimum) below half its prior's. For example, when every trial uses every
device, per-type compute factors are not identified one by one (only their pooled effect is), and intra- and
inter-node link efficiencies trade off when every ring crosses nodes.

Which parameters move is selected (:func:`select_structure`) among four nested structures (:func:`structures`: one
common time factor, which keeps the uncalibrated ranking; + the micro-batch exponent; + per-type compute factors and
instruction costs; + link efficiencies) by how well each one's leave-one-out predictions order the measured
strategies: with k ≈ 8–10 points, fitting everything halves the error but lets unidentified parameters (a GPU
type's compute factor against the intra-node link efficiency, η on three large-mbs points) swap held-out pairs. A
structure that moves the ranking is taken only where its held-out order is no worse than the one time factor's,
counted both ways (pairs weighted by how far apart they were measured, and plain pairs as Spearman counts them).
docs/calibration.md has the measurements.

Leave-one-out: every measured strategy is predicted by a fit on the others (same free parameters); the report gives
the held-out MAPE and the Spearman ρ of the held-out predictions against the measurements, beside the uncalibrated
model's.

Output: ``OUT.csv`` is an ordinary profile (``model,device,tp,mbs,layer,forward_s,backward_s`` plus the ignored
``calibration_factor`` and ``base_source``) holding the per-layer times the cost model used (the plan's profile
where it covers a layer, the roofline elsewhere, as :func:`ampe.costmodel.compute.layer_times` derives them) with
the compute factor and micro-batch exponent applied. ``OUT.csv.calibration.json`` (:mod:`ampe.formats.calibration`)
holds the instruction costs and link efficiencies, which :func:`ampe.costmodel.profile.load_profile` finds and the
cost model applies, and the fit report. Passing ``OUT.csv`` as ``--profile`` applies the whole calibration.

Rows are written for every GPU type of the cluster, every tensor-parallel degree that divides a node of that type
(and every degree in the base profile), and every micro-batch size that divides the global batch (and every size in
the base profile), so the next search finds calibrated times for all its candidates.
"""


from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ampe.costmodel.strategy import strategy_from_dict
from ampe.errors import InputError
from ampe.formats.calibration import SIDECAR_SUFFIX, CalibrationFile, CalibrationFit, CalibrationParams, CandidateScore
from ampe.io import check_output_path, write_json_atomic, write_text_atomic
from ampe.report.calibration.fit import fit_calibration, fitted_parameters
from ampe.report.calibration.measured import (
    CalibrationInputs,
    as_frozen,
    as_ran,
    inputs_from_plan,
    measured_set,
    predict,
    uncalibrated_estimates,
)
from ampe.report.calibration.selection import Folds
from ampe.report.calibration.table import profile_csv
from ampe.report.compare import Report, ReportRow, mape, spearman


@dataclass(frozen=True)
class Calibration:
    """What ``ampe report --calibrate`` fitted and wrote."""

    params: CalibrationParams
    fit: CalibrationFit
    rows: int  # rows written to the CSV
    base_source: str  # "profile <path> + roofline" or "roofline"
    method: str  # pipeline-time method used to re-estimate ("eq5" | "simulate")
    sidecar: str  # path of the sidecar JSON
    selected_on: int  # strategies the structure selection and leave-one-out ran on (a bounded, even sample)


LOADED_CORES = 0.25  # a trial during which other processes kept this many cores busy ran under host load
PLAUSIBLE_COMPUTE_FACTOR = (0.5, 2.0)  # beyond this, the profile or the fit is off, not the hardware


def load_caution(rows: Sequence[ReportRow]) -> str | None:
    """``k of n trials ran under host load (other processes kept a–b cores busy)`` over the measured ``rows``, or
    None when none ran with ≥ :data:`LOADED_CORES` other busy cores (or none says)."""
    loaded = [r.host_other_cores for r in rows if r.host_other_cores is not None and r.host_other_cores >= LOADED_CORES]
    if not loaded:
        return None
    return (f"{len(loaded)} of {len(rows)} trials ran under host load (other processes kept "
            f"{min(loaded):.2f}–{max(loaded):.2f} cores busy)")


def cautions(rows: Sequence[ReportRow], fit: CalibrationFit) -> tuple[str, ...]:
    """Why a fit may not hold on a quiet machine, one sentence each: trials that ran while other processes kept
    ≥ :data:`LOADED_CORES` cores busy (the worker's ``host_other_cores``), fitted compute factors outside
    :data:`PLAUSIBLE_COMPUTE_FACTOR`, and link efficiencies the fit holds at their bound 1 while the measurements
    want them higher (a link cannot beat its spec: the bound is part of the fit, docs/calibration.md). The fit is
    still written; every reader of it says these."""
    load = load_caution(rows)
    out = [f"{load}: the fit includes that load; measure on a quiet machine before trusting it"] if load else []
    lo, hi = PLAUSIBLE_COMPUTE_FACTOR
    for p in fit.parameters:
        if p.moved is False:
            continue
        if p.name.startswith("compute_factor") and not lo <= p.value <= hi:
            out.append(f"{p.name} {p.value:.3g} is outside the plausible {lo:g}–{hi:g}: the profile was measured "
                       "under other conditions than the trials (load, clocks, another machine)")
        if p.at_bound:
            out.append(f"{p.name} is held at its bound 1 (the cluster spec's bandwidth) though the measurements want "
                       "faster links: the other parameters took up the difference (if the links really are faster, "
                       "the spec's figure is low: raise it there)")
    return tuple(out)


def inputs_from_report(report: Report) -> CalibrationInputs:
    """The calibration inputs of a trials folder's report (from the plan the trials came from)."""
    where = report.directory or "results folder"
    if report.plan is None:
        raise InputError(where, "plan.json", "missing: calibration needs the plan the trials came from")
    return inputs_from_plan(report.plan, f"{where}/plan.json")


def calibrate(report: Report, out_csv: str | Path, inputs: CalibrationInputs | None = None,
              progress: Callable[[float, float], None] | None = None) -> Calibration:
    """Fit the calibration on the report's measured strategies (without a frequency schedule) and write
    ``out_csv`` and its sidecar. ``inputs`` default to the trials folder's plan. ``progress(done, total)``: the
    structure selection's leave-one-out fits (most of the work), as they are made."""
    inputs = inputs or inputs_from_report(report)
    where = inputs.where or report.directory or "measurements"
    rows = [r for r in report.measured if not r.schedule_applied]
    if not rows:
        raise InputError(where, "results", "nothing to calibrate from: no strategy measured ok (runs with a frequency "
                         "schedule are not used)")
    check_output_path(str(out_csv) + SIDECAR_SUFFIX, "--calibrate (sidecar)")
    strategies = [strategy_from_dict(r.strategy, where) for r in rows]
    inputs = as_frozen(as_ran(inputs, strategies, where), [r.strategy.get("frozen_layers") for r in rows], where)
    measured = [float(r.measured_s or 0.0) for r in rows]
    data = measured_set(inputs, strategies, measured)
    picked = selection_sample(measured)
    sample = data if len(picked) == len(rows) else \
        measured_set(inputs, [strategies[i] for i in picked], [measured[i] for i in picked])
    folds = Folds([sample], progress)  # leave-one-out costs n fits of n strategies per structure: on a bounded sample
    chosen, scores = folds.select()
    fit = fit_calibration([data], structure=chosen)  # the parameters: fitted on every strategy
    allowed = {st.name for st in folds.allowed(scores)} if scores else set()
    before = uncalibrated_estimates(data)
    after = predict(data, fit.params)
    # The selected structure's leave-one-out, from the fits the selection made (the selection itself saw every
    # strategy: benchmarks/calibration.py gives the nested figure, selected on each fold's training strategies alone).
    loo = folds.held_out(fit.structure)[0] if len(rows) >= 3 else None
    summary = CalibrationFit(
        strategies=len(rows), parameters=fitted_parameters(fit), structure=fit.structure,
        mape_before_pct=mape(before, data.measured_s), mape_after_pct=mape(after, data.measured_s),
        loo_mape_pct=None if loo is None else mape(loo, sample.measured_s),
        loo_spearman=None if loo is None else spearman(list(loo), list(sample.measured_s))[0],
        spearman_before=spearman(list(before), list(data.measured_s))[0],
        candidates=tuple(CandidateScore(structure=name, discordance=s.discordance,
                                        plain_discordance=s.plain_discordance, loo_mape_pct=s.mape_pct,
                                        allowed=name in allowed) for name, s in scores.items()))
    summary = summary.model_copy(update={"cautions": cautions(rows, summary)})
    base = "roofline" if inputs.profile is None else f"profile {inputs.profile_path}"
    text, n = profile_csv(data.table, inputs.model.name, fit.params, base)
    write_text_atomic(out_csv, text)
    sidecar = str(out_csv) + SIDECAR_SUFFIX
    write_json_atomic(sidecar, CalibrationFile(params=fit.params, fit=summary, base_source=base).to_json())
    return Calibration(fit.params, summary, n, base if inputs.profile is None else f"{base} + roofline",
                       inputs.method, sidecar, len(picked))


MAX_SELECTION_STRATEGIES = 40  # leave-one-out work grows as n² (n fits of n points per structure): 52 strategies
# took 22 s, 100 took 79 s on the development machine; 40 take about 13 s


def selection_sample(measured_s: list[float]) -> list[int]:
    """Indices of the measured strategies the structure selection and leave-one-out run on: all of them up to
    MAX_SELECTION_STRATEGIES, else that many spread evenly over the measured times (fastest and slowest kept), so
    the work is bounded whatever the number of strategies. The parameters are then fitted on every strategy."""
    n = len(measured_s)
    if n <= MAX_SELECTION_STRATEGIES:
        return list(range(n))
    by_time = sorted(range(n), key=lambda i: (measured_s[i], i))
    step = (n - 1) / (MAX_SELECTION_STRATEGIES - 1)
    return sorted({by_time[round(k * step)] for k in range(MAX_SELECTION_STRATEGIES)})
