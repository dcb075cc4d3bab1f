"""Close the loop: measured strategies → a structurally calibrated cost model for the next search.

Measured iteration times (a trials folder, or any measurements file) fit the cost-model parameters the data can
identify, regularised toward the uncalibrated model (a Gaussian prior on each, in log space for factors)::

    compute_factor[type]   per-layer compute time × factor                          prior 1, sd e^±1
    mbs_exponent η         per-layer time × mbs^(−η): utilisation gains at large mbs  prior 0, sd 0.5
    pipeline_op_s[type]    fixed seconds per pipeline instruction (forward, backward)  prior: the catalog's, sd 5 ms
    link_efficiency[class] achieved fraction of intra-/inter-node bandwidth           prior 1, sd e^±1
                           for pipeline sends and gradient all-reduces

The fit minimises Σ (log estimate − log measured)² / σ² + Σ ((θ − θ₀) / σ₀)² with σ = 5 % (scipy's
``least_squares``): the maximum a posteriori estimate. Directions the data cannot see stay at the prior. A parameter
is reported as *fitted* (identified) when the measurements shrink its posterior standard deviation (Gauss–Newton at
the optimum) below half its prior's. For example, when every trial uses every device, per-type compute factors are
not identified one by one (only their pooled effect is), and intra- and inter-node link efficiencies trade off when
every ring crosses nodes.

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

import csv
import io
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ampe.costmodel.calibration import link_classes
from ampe.costmodel.cluster import Cluster, load_cluster
from ampe.costmodel.compute import layer_times
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.model import Model
from ampe.costmodel.profile import Profile, ProfileSample
from ampe.costmodel.strategy import Strategy, strategy_from_dict
from ampe.errors import InputError
from ampe.formats.calibration import (
    SIDECAR_SUFFIX,
    CalibrationFile,
    CalibrationFit,
    CalibrationParams,
    CandidateScore,
    FittedParameter,
)
from ampe.io import check_output_path, write_json_atomic, write_text_atomic
from ampe.report.compare import Report, mape, spearman
from ampe.trials.planfile import TrialPlan

PROFILE_COLUMNS = ("model", "device", "tp", "mbs", "layer", "forward_s", "backward_s", "calibration_factor",
                   "base_source")
RESIDUAL_SD = 0.05  # relative error the fit expects of one measurement against the cost model
IDENTIFIED = 0.5  # a parameter is fitted when the data shrink its prior sd to below this fraction
MAX_EVALUATIONS = 60  # cost-model passes per fit (each costs every measured strategy once)
MIN_SELECT = 4  # fewer measured strategies: fit the one time factor, no structure selection
TYPE_SD = 0.25  # prior sd (log) of a GPU type's compute factor about the types' common factor
RANK_TOLERANCE = 0.02  # structures this close to the best held-out discordance are ranked by held-out MAPE
Point = tuple[int, int]  # a measured strategy: (set, index)

# (device, tp, mbs) → (forward per layer, backward per layer, source), seconds for one micro-batch on one tp rank
LayerTable = dict[tuple[str, int, int], tuple[np.ndarray, np.ndarray, str]]


@dataclass(frozen=True)
class CalibrationInputs:
    """What the cost model predicted the measured strategies from (and calibrates): cluster, model as trained,
    profile, global batch (samples), pipeline-time method."""

    cluster: Cluster
    model: Model  # as trained (a frozen prefix applied)
    profile: Profile | None
    profile_path: str | None
    global_batch: int
    method: str = "eq5"
    where: str = ""


@dataclass(frozen=True)
class MeasuredSet:
    """Measured strategies on one cluster with the per-layer table the calibration scales."""

    inputs: CalibrationInputs
    table: LayerTable
    strategies: tuple[Strategy, ...]
    measured_s: np.ndarray  # seconds per iteration, one per strategy


@dataclass(frozen=True)
class ParameterSpace:
    """The calibrated parameters as a vector: names, prior means and sds, bounds (internal units: log factors,
    milliseconds for instruction costs)."""

    names: tuple[str, ...]
    prior: np.ndarray
    prior_sd: np.ndarray
    lower: np.ndarray
    upper: np.ndarray

    def decode(self, theta: np.ndarray) -> CalibrationParams:
        """The parameters ``theta`` stands for."""
        compute, ops, links, eta = {}, {}, {}, 0.0
        for name, x in zip(self.names, theta, strict=True):
            kind, _, key = name.partition(":")
            if kind == "compute_factor":
                compute[key] = math.exp(x)
            elif kind == "pipeline_op_s":
                ops[key] = max(float(x), 0.0) * 1e-3
            elif kind == "link_efficiency":
                links[key] = math.exp(x)
            else:
                eta = float(x)
        return CalibrationParams(compute_factor=compute, mbs_exponent=eta, pipeline_op_s=ops,
                                 link_efficiency=links)  # type: ignore[arg-type]

    def shown(self, i: int, x: float) -> float:
        """Parameter ``i`` at internal value ``x`` in its public unit (factor, exponent, seconds)."""
        kind = self.names[i].partition(":")[0]
        return math.exp(x) if kind in ("compute_factor", "link_efficiency") else x * 1e-3 if \
            kind == "pipeline_op_s" else x


@dataclass(frozen=True)
class Structure:
    """Which parameters a fit moves: θ = θ₀ + design · x, with a prior x ~ N(0, prior_sd²) inside [lower, upper].

    ``scale`` (a column index, or −1): that column is one common time factor (log): it adds to every compute
    factor's log, subtracts from every link efficiency's, and multiplies every instruction cost, so it moves every
    strategy's time together and keeps the uncalibrated ranking (up to the terms it does not scale: latencies)."""

    name: str
    design: np.ndarray  # (parameters, columns)
    prior_sd: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    scale: int = -1

    def theta(self, space: ParameterSpace, x: np.ndarray) -> np.ndarray:
        """The full parameter vector for column values ``x``."""
        theta = space.prior + self.design @ x
        if self.scale >= 0:
            ops = np.array([n.startswith("pipeline_op_s:") for n in space.names])
            theta[ops] = space.prior[ops] * math.exp(float(x[self.scale])) + (self.design[ops] @ x)
        return theta

    @property
    def free(self) -> tuple[bool, ...]:
        """Parameters this structure moves."""
        return tuple(bool(x) for x in np.any(self.design != 0, axis=1))

    def moves(self, space: ParameterSpace) -> tuple[bool, ...]:
        """:attr:`free`, and the non-zero instruction costs the time factor multiplies."""
        ops = [n.startswith("pipeline_op_s:") and self.scale >= 0 and bool(p != 0)
               for n, p in zip(space.names, space.prior, strict=True)]
        return tuple(bool(f or o) for f, o in zip(self.free, ops, strict=True))

    @classmethod
    def select(cls, name: str, mask: Sequence[bool] | np.ndarray, space: ParameterSpace,
               scale: bool = False) -> Structure:
        """Each parameter of ``mask`` on its own (with its prior), plus one common time factor if ``scale``."""
        mask = np.asarray(mask, dtype=bool)
        idx = np.flatnonzero(mask)
        design = np.zeros((len(space.names), len(idx) + scale))
        design[idx, np.arange(len(idx))] = 1.0
        sd, lo, hi = space.prior_sd[idx], space.lower[idx] - space.prior[idx], space.upper[idx] - space.prior[idx]
        if scale:
            kinds = [n.partition(":")[0] for n in space.names]
            design[:, -1] = [1.0 if k == "compute_factor" else -1.0 if k == "link_efficiency" else 0.0
                             for k in kinds]
            sd, lo, hi = (np.append(sd, 1.0), np.append(lo, math.log(1e-3)), np.append(hi, math.log(1e3)))
        return cls(name, design, sd, lo, hi, len(idx) if scale else -1)

    def pooled_compute(self, space: ParameterSpace) -> Structure:
        """This structure with the per-type compute factors (when it moves two or more) as one common factor (prior
        sd e^±1) times a per-type deviation (prior sd e^±``TYPE_SD``): the types' relative speeds stay near the
        catalog's unless the data insist. Trials on a mixed cluster see the types' factors mostly through their
        pooled effect, which trades off against the link efficiencies."""
        rows = [i for i, n in enumerate(space.names) if n.startswith("compute_factor:") and self.free[i]]
        if len(rows) < 2:
            return self
        common = np.zeros((len(space.names), 1))
        common[rows, 0] = 1.0
        return Structure(self.name, np.hstack([self.design, common]), np.append(np.where(
            np.any(self.design[rows] != 0, axis=0), TYPE_SD, self.prior_sd), 1.0),
            np.append(self.lower, math.log(1e-3)), np.append(self.upper, math.log(1e3)), self.scale)


def structures(space: ParameterSpace) -> tuple[Structure, ...]:
    """The candidate structures, simplest first: one time factor; + the micro-batch exponent; per-type compute
    factors (pooled: :meth:`Structure.pooled_compute`), exponent and instruction costs; everything (+ link
    efficiencies)."""
    kinds = np.array([n.partition(":")[0] for n in space.names])
    eta = kinds == "mbs_exponent"
    no_links = kinds != "link_efficiency"
    return (Structure.select("scale", np.zeros(len(kinds), dtype=bool), space, scale=True),
            Structure.select("scale+mbs", eta, space, scale=True),
            Structure.select("compute+mbs+ops", no_links, space).pooled_compute(space),
            Structure.select("full", np.ones(len(kinds), dtype=bool), space).pooled_compute(space))


@dataclass(frozen=True)
class FitResult:
    """Fitted parameters, which of them the data identified, and in-sample errors (percent)."""

    params: CalibrationParams
    theta: np.ndarray
    free: tuple[bool, ...]  # moved by the fit's structure (the others stayed at the prior)
    identified: tuple[bool, ...]  # the data shrank its prior sd below IDENTIFIED
    posterior_sd: np.ndarray
    space: ParameterSpace
    structure: str = "full"  # the candidate structure fitted (:func:`structures`)


@dataclass(frozen=True)
class Calibration:
    """What ``ampe report --calibrate`` fitted and wrote."""

    params: CalibrationParams
    fit: CalibrationFit
    rows: int  # rows written to the CSV
    base_source: str  # "profile <path> + roofline" or "roofline"
    method: str  # pipeline-time method used to re-estimate ("eq5" | "simulate")
    sidecar: str  # path of the sidecar JSON


def inputs_from_report(report: Report) -> CalibrationInputs:
    """The calibration inputs of a trials folder's report (from the plan the trials came from)."""
    where = report.directory or "results folder"
    if report.plan is None:
        raise InputError(where, "plan.json", "missing: calibration needs the plan the trials came from")
    return inputs_from_plan(report.plan, f"{where}/plan.json")


def inputs_from_plan(plan: TrialPlan, where: str, cluster: Cluster | None = None) -> CalibrationInputs:
    """The calibration inputs of a plan (its cluster spec unless ``cluster`` is given, model, profile, method)."""
    if cluster is None:
        if not plan.cluster_spec:
            raise InputError(where, "inputs.cluster_spec", "missing: calibration needs the cluster spec")
        cluster = load_cluster(plan.cluster_spec)
    trained, profile = plan.cost_inputs(cluster)
    method = str((plan.raw.get("search") or {}).get("method", "eq5"))
    return CalibrationInputs(cluster, trained, profile, plan.profile, plan.global_batch,
                             method if method in ("eq5", "simulate") else "eq5", where)


def measured_set(inputs: CalibrationInputs, strategies: Sequence[Strategy], measured_s: Sequence[float] | np.ndarray
                 ) -> MeasuredSet:
    """A :class:`MeasuredSet` (builds the base per-layer table once)."""
    table = base_layer_table(inputs.model, inputs.cluster, inputs.profile, inputs.global_batch)
    return MeasuredSet(inputs, table, tuple(strategies), np.asarray(measured_s, dtype=float))


def as_ran(inputs: CalibrationInputs, strategies: Sequence[Strategy], where: str) -> CalibrationInputs:
    """``inputs`` with the model as the measured strategies ran it (their attention kernel and precision: a CPU
    trial of a bf16 plan ran fp32), so the per-layer table the fit scales, its "before" and its "after" are all of
    what ran. One variant per calibration: strategies of several are refused (calibrate each set on its own)."""
    model = inputs.model
    ran = {(s.attention or model.attention, s.dtype or model.dtype) for s in strategies}
    if len(ran) > 1:
        shown = ", ".join(f"{a}/{d}" for a, d in sorted(ran))
        raise InputError(where, "strategy.attention/dtype", f"the measured strategies ran several attention kernels or "
                         f"precisions ({shown}): calibrate each set on its own")
    (attention, dtype), = ran
    if (attention, dtype) == (model.attention, model.dtype):
        return inputs
    try:
        return replace(inputs, model=model.variant(attention, dtype))
    except ValueError as e:
        raise InputError(where, "strategy.attention", str(e)) from None


def calibrate(report: Report, out_csv: str | Path, inputs: CalibrationInputs | None = None) -> Calibration:
    """Fit the calibration on the report's measured strategies (without a frequency schedule) and write
    ``out_csv`` and its sidecar. ``inputs`` default to the trials folder's plan."""
    inputs = inputs or inputs_from_report(report)
    where = inputs.where or report.directory or "measurements"
    rows = [r for r in report.measured if not r.schedule_applied]
    if not rows:
        raise InputError(where, "results", "nothing to calibrate from: no strategy measured ok (runs with a frequency "
                         "schedule are not used)")
    check_output_path(str(out_csv) + SIDECAR_SUFFIX, "--calibrate (sidecar)")
    strategies = [strategy_from_dict(r.strategy, where) for r in rows]
    inputs = as_ran(inputs, strategies, where)
    data = measured_set(inputs, strategies, [float(r.measured_s or 0.0) for r in rows])
    folds = Folds([data])
    chosen, scores = folds.select()
    fit = fit_calibration([data], structure=chosen)
    allowed = {st.name for st in folds.allowed(scores)} if scores else set()
    before = uncalibrated_estimates(data)
    after = predict(data, fit.params)
    # The selected structure's leave-one-out, from the fits the selection made (the selection itself saw every
    # strategy: benchmarks/calibration.py gives the nested figure, selected on each fold's training strategies alone).
    loo = folds.held_out(fit.structure)[0] if len(rows) >= 3 else None
    summary = CalibrationFit(
        strategies=len(rows), parameters=_parameters(fit), structure=fit.structure,
        mape_before_pct=mape(before, data.measured_s), mape_after_pct=mape(after, data.measured_s),
        loo_mape_pct=None if loo is None else mape(loo, data.measured_s),
        loo_spearman=None if loo is None else spearman(list(loo), list(data.measured_s))[0],
        spearman_before=spearman(list(before), list(data.measured_s))[0],
        candidates=tuple(CandidateScore(structure=name, discordance=s.discordance,
                                        plain_discordance=s.plain_discordance, loo_mape_pct=s.mape_pct,
                                        allowed=name in allowed) for name, s in scores.items()))
    base = "roofline" if inputs.profile is None else f"profile {inputs.profile_path}"
    text, n = profile_csv(data.table, inputs.model.name, fit.params, base)
    write_text_atomic(out_csv, text)
    sidecar = str(out_csv) + SIDECAR_SUFFIX
    write_json_atomic(sidecar, CalibrationFile(params=fit.params, fit=summary, base_source=base).to_json())
    return Calibration(fit.params, summary, n, base if inputs.profile is None else f"{base} + roofline",
                       inputs.method, sidecar)


# --- the fit ---------------------------------------------------------------------------------------------------
def parameter_space(sets: Sequence[MeasuredSet]) -> ParameterSpace:
    """Every parameter the sets could inform: per GPU type (compute, instruction cost), η, per link class."""
    types: dict[str, float] = {}
    classes: list[str] = []
    for s in sets:
        for g in s.inputs.cluster.gpu_types():
            types.setdefault(g.name, g.pipeline_op_s)
        classes += [c for c in link_classes(s.inputs.cluster) if c not in classes]
    names, prior, sd, lo, hi = [], [], [], [], []

    def add(name: str, p: float, s: float, low: float, high: float) -> None:
        names.append(name)
        prior.append(p)
        sd.append(s)
        lo.append(low)
        hi.append(high)

    for t in types:
        add(f"compute_factor:{t}", 0.0, 1.0, math.log(1e-3), math.log(1e3))
    add("mbs_exponent", 0.0, 0.5, -0.5, 0.95)
    for t, op in types.items():
        add(f"pipeline_op_s:{t}", op * 1e3, 5.0, 0.0, 1e4)
    for c in sorted(classes):
        add(f"link_efficiency:{c}", 0.0, 1.0, math.log(1e-3), math.log(1e3))
    return ParameterSpace(tuple(names), *(np.array(v, dtype=float) for v in (prior, sd, lo, hi)))


def predict(data: MeasuredSet, params: CalibrationParams) -> np.ndarray:
    """Seconds per iteration of ``data``'s strategies under ``params``."""
    inp = data.inputs
    needed = {(s.tp, s.mbs) for s in data.strategies} | {(1, 1)}  # (1, 1): the cost model's GPU-type ranking
    table = {k: v for k, v in data.table.items() if (k[1], k[2]) in needed}
    profile = scaled_profile(table, inp.model.name, params)
    cm = CostModel(inp.cluster, inp.model, profile)
    return np.array([cm.iteration_time(s, inp.method) for s in data.strategies])


def uncalibrated_estimates(data: MeasuredSet) -> np.ndarray:
    """Seconds per iteration the cost model gives with the original inputs (no calibration)."""
    inp = data.inputs
    cm = CostModel(inp.cluster, inp.model, inp.profile)
    return np.array([cm.iteration_time(s, inp.method) for s in data.strategies])


def fit_calibration(sets: Sequence[MeasuredSet], free: Sequence[bool] | None = None,
                    skip: tuple[int, int] | None = None, uncertainty: bool = True,
                    structure: Structure | str | None = None) -> FitResult:
    """Fit the parameters on every measured strategy of ``sets`` (but ``skip`` = (set, index), for leave-one-out).

    ``structure`` says which parameters move (a :class:`Structure` or the name of one of :func:`structures`);
    ``"select"`` picks one by :func:`select_structure` on the same data. Without it, ``free`` (a mask) or else
    every parameter moves; the rest stay at the prior. ``uncertainty`` also computes each parameter's posterior sd
    and whether the data identified it (one more cost-model pass per parameter)."""
    space = parameter_space(sets)
    if isinstance(structure, str):
        st = select_structure(sets, skip)[0] if structure == "select" else \
            {c.name: c for c in structures(space)}[structure]
    elif structure is not None:
        st = structure
    else:
        mask = np.ones(len(space.names), dtype=bool) if free is None else np.asarray(free, dtype=bool)
        st = Structure.select("free", mask, space)
    theta = _solve(sets, space, np.asarray(st.free), skip, st)
    sd = _posterior_sd(sets, space, theta, skip) if uncertainty else np.full(len(theta), np.nan)
    moved = st.moves(space)
    # Identified: moved by the structure and pinned by the data. A parameter the structure holds at the prior is not
    # (the scale structure kept η = 0 while the data's posterior sd called it identified).
    return FitResult(space.decode(theta), theta, moved,
                     tuple(bool(m and x) for m, x in zip(moved, sd < IDENTIFIED * space.prior_sd, strict=True)),
                     sd, space, st.name)


@dataclass(frozen=True)
class StructureScore:
    """How well one structure's leave-one-out predictions order the measured strategies they were not fitted on:
    weighted discordance (:func:`held_out_discordance`), the plain fraction of pairs the wrong way (a tie half; what
    Spearman counts), and the held-out MAPE (percent)."""

    discordance: float
    plain_discordance: float
    mape_pct: float


class Folds:
    """Fits on the measured strategies less a few held out, each made once per structure: leave-one-out, the
    structure selection nested in it, and the final fit share the fits that hold out the same strategies (the
    nested leave-one-out of n strategies costs n(n − 1)/2 fits per structure, not n(n − 1))."""

    def __init__(self, sets: Sequence[MeasuredSet]) -> None:
        self.sets = list(sets)
        self.space = parameter_space(self.sets)
        self.candidates = structures(self.space)
        self._by_name = {st.name: st for st in self.candidates}
        self._fits: dict[tuple[str, frozenset[Point]], list[np.ndarray]] = {}

    def made_from(self, sets: Sequence[MeasuredSet]) -> bool:
        """Whether these folds were made from exactly ``sets`` (the same objects, in order)."""
        return len(sets) == len(self.sets) and all(a is b for a, b in zip(sets, self.sets, strict=True))

    def points(self, held: frozenset[Point] = frozenset()) -> list[Point]:
        """Every measured strategy but ``held``."""
        return [(k, i) for k, d in enumerate(self.sets) for i in range(len(d.strategies)) if (k, i) not in held]

    def predictions(self, structure: str, held: frozenset[Point]) -> list[np.ndarray]:
        """Seconds per iteration of every strategy of every set (held out or not), under the fit of ``structure``
        on the strategies not in ``held``."""
        key = (structure, held)
        if key not in self._fits:
            train = self.sets
            for point in sorted(held, reverse=True):  # the later index first: the earlier keeps its place
                train = _without(train, point)
            theta = _solve(train, self.space, np.asarray(self._by_name[structure].free), None,
                           self._by_name[structure])
            params = self.space.decode(theta)
            self._fits[key] = [predict(d, params) for d in self.sets]
        return self._fits[key]

    def score(self, structure: str, held: frozenset[Point] = frozenset()) -> StructureScore:
        """Leave-one-out over the strategies not in ``held``: each predicted by the fit on the others, and placed
        among those others of its set."""
        points = self.points(held)
        num = den = plain = pairs = 0.0
        errors = []
        for k, i in points:
            pred = self.predictions(structure, held | {(k, i)})[k]
            keep = [j for (s, j) in points if s == k]
            at = keep.index(i)
            meas = self.sets[k].measured_s[keep]
            n, d = held_out_discordance(pred[keep], meas, at)
            num, den = num + n, den + d
            wrong = np.delete(_wrong_way(pred[keep], meas, at), at)
            plain += float(np.sum(wrong))
            pairs += len(wrong)
            errors.append(abs(pred[i] - meas[at]) / meas[at])
        return StructureScore(num / den if den > 0 else 0.0, plain / pairs if pairs else 0.0,
                              100.0 * float(np.mean(errors)))

    def held_out(self, structure: str) -> list[np.ndarray]:
        """:func:`leave_one_out` of ``structure`` (a name, or ``"select"``: selected on each fold's others)."""
        out = []
        for k, data in enumerate(self.sets):
            held = np.empty(len(data.strategies))
            for i in range(len(data.strategies)):
                one = frozenset({(k, i)})
                name = self.select(one)[0].name if structure == "select" else structure
                held[i] = self.predictions(name, one)[k][i]
            out.append(held)
        return out

    def allowed(self, scores: dict[str, StructureScore]) -> list[Structure]:
        """The candidates the selection may take: the one time factor (the uncalibrated order, rescaled), and each
        structure whose held-out order is no worse than the time factor's by both discordances."""
        first = scores[self.candidates[0].name]
        return [self.candidates[0]] + [
            st for st in self.candidates[1:] if scores[st.name].discordance <= first.discordance
            and scores[st.name].plain_discordance <= first.plain_discordance]

    def select(self, held: frozenset[Point] = frozenset()) -> tuple[Structure, dict[str, StructureScore]]:
        """:func:`select_structure` on the strategies not in ``held``."""
        if len(self.points(held)) < MIN_SELECT:
            return self.candidates[0], {}
        scores = {st.name: self.score(st.name, held) for st in self.candidates}
        allowed = self.allowed(scores)
        best = min(scores[st.name].discordance for st in allowed)
        tied = [st for st in allowed if scores[st.name].discordance <= best + RANK_TOLERANCE]
        return min(tied, key=lambda st: scores[st.name].mape_pct), scores


def leave_one_out(sets: Sequence[MeasuredSet], free: Sequence[bool] | Structure | str | None = None
                  ) -> list[np.ndarray]:
    """Per set, each strategy's seconds predicted by a fit on all the other measured strategies (``free``: a mask,
    a structure or its name; ``"select"`` selects the structure on each fold's training strategies alone)."""
    if isinstance(free, str):
        return Folds(sets).held_out(free)
    out = []
    for k, data in enumerate(sets):
        held = np.empty(len(data.strategies))
        for i in range(len(data.strategies)):
            if isinstance(free, Structure):
                fit = fit_calibration(sets, skip=(k, i), uncertainty=False, structure=free)
            else:
                fit = fit_calibration(sets, free, skip=(k, i), uncertainty=False)
            held[i] = predict(_only(data, i), fit.params)[0]
        out.append(held)
    return out


def select_structure(sets: Sequence[MeasuredSet], skip: Point | None = None, folds: Folds | None = None
                     ) -> tuple[Structure, dict[str, StructureScore]]:
    """The candidate structure (:func:`structures`) whose leave-one-out predictions on ``sets`` (less ``skip``)
    order the strategies best.

    The one time factor (the first candidate) keeps the uncalibrated order; a structure that moves the order is
    allowed only where its held-out order is no worse than the time factor's by both the weighted discordance
    (:func:`held_out_discordance`) and the plain fraction of pairs the wrong way (what Spearman counts): with k ≈ 8
    strategies, a fit that fixes two pairs measured 20 % apart and breaks six measured 2 % apart is no better for the
    next search. Among those allowed: the lowest weighted discordance; among those within ``RANK_TOLERANCE`` of it,
    the lowest held-out MAPE; the simplest on a tie. Fewer than ``MIN_SELECT`` strategies: the time factor. Returns
    it and every candidate's :class:`StructureScore`. ``folds`` (made from ``sets``) shares fits between calls."""
    if folds is None:
        folds = Folds(sets)
    elif not folds.made_from(sets):
        raise ValueError("select_structure: folds were made from other measured sets")
    return folds.select(frozenset() if skip is None else frozenset({skip}))


def pair_concordance(data: MeasuredSet, structures: Sequence[str] = ("select",), folds: Folds | None = None
                     ) -> dict[str, float]:
    """Leave-two-out (k = n − 2 fitted): for every pair of strategies, fit on the others and ask whether the one fit
    orders the pair as measured; the fraction right, each pair weighted by |log measured ratio| (a pair measured
    1 % apart counts little; a predicted tie is half right). Unlike leave-one-out Spearman, both predictions of a
    pair come from one fit. ``structures``: names, or ``"select"`` (selected on the pair's others alone). Keys:
    ``"uncalibrated"`` and each structure's name. ``folds`` (made from ``[data]``) shares fits."""
    if folds is None:
        folds = Folds([data])
    elif not folds.made_from([data]):
        raise ValueError("pair_concordance: folds were made from other measured strategies")
    n, m = len(data.strategies), data.measured_s
    before = uncalibrated_estimates(data)
    right = dict.fromkeys(("uncalibrated", *structures), 0.0)
    total = 0.0
    for i, j in itertools.combinations(range(n), 2):
        w = abs(math.log(m[i] / m[j]))
        total += w
        held = frozenset({(0, i), (0, j)})
        preds = {"uncalibrated": before[[i, j]]}
        for name in structures:
            fitted = folds.select(held)[0].name if name == "select" else name
            preds[name] = folds.predictions(fitted, held)[0][[i, j]]
        for name, (pi, pj) in preds.items():
            right[name] += w * (0.5 if pi == pj else float((pi - pj) * (m[i] - m[j]) > 0))
    return {k: v / total if total > 0 else 1.0 for k, v in right.items()}


def held_out_discordance(pred: np.ndarray, meas: np.ndarray, i: int) -> tuple[float, float]:
    """How wrongly strategy ``i`` (held out) is placed among the others: Σ over the others of
    |log measured ratio| where the predicted order of the pair is the wrong way (a predicted tie counts half), and
    Σ |log measured ratio| (the weights: a pair measured 1 % apart counts little)."""
    w = np.abs(np.log(meas / meas[i]))
    return float(np.sum(w * _wrong_way(pred, meas, i))), float(np.sum(w))


def _wrong_way(pred: np.ndarray, meas: np.ndarray, i: int) -> np.ndarray:
    """Per strategy, whether its pair with strategy ``i`` is predicted the wrong way round: 1, a predicted or
    measured tie 0.5 (strategy ``i`` itself included, as a tie), else 0."""
    sign = np.sign(pred - pred[i]) * np.sign(meas - meas[i])
    return np.where(sign < 0, 1.0, np.where(sign == 0, 0.5, 0.0))


def _without(sets: Sequence[MeasuredSet], skip: tuple[int, int]) -> list[MeasuredSet]:
    """``sets`` without strategy ``skip`` = (set, index)."""
    out = []
    for k, d in enumerate(sets):
        idx = [i for i in range(len(d.strategies)) if (k, i) != skip]
        out.append(MeasuredSet(d.inputs, d.table, tuple(d.strategies[i] for i in idx), d.measured_s[idx]))
    return out


def _only(data: MeasuredSet, i: int) -> MeasuredSet:
    return MeasuredSet(data.inputs, data.table, (data.strategies[i],), data.measured_s[i:i + 1])


def _data_residuals(sets: Sequence[MeasuredSet], space: ParameterSpace, skip: tuple[int, int] | None
                    ) -> Callable[[np.ndarray], np.ndarray]:
    logs = [np.log(s.measured_s) for s in sets]

    def f(theta: np.ndarray) -> np.ndarray:
        params = space.decode(theta)
        parts = []
        for k, data in enumerate(sets):
            r = (np.log(predict(data, params)) - logs[k]) / RESIDUAL_SD
            if skip is not None and skip[0] == k:
                r = np.delete(r, skip[1])
            parts.append(r)
        return np.concatenate(parts)

    return f


def _residuals(sets: Sequence[MeasuredSet], space: ParameterSpace, skip: tuple[int, int] | None
               ) -> Callable[[np.ndarray], np.ndarray]:
    data = _data_residuals(sets, space, skip)
    return lambda theta: np.concatenate([data(theta), (theta - space.prior) / space.prior_sd])


def _solve(sets: Sequence[MeasuredSet], space: ParameterSpace, free: np.ndarray,
           skip: tuple[int, int] | None, structure: Structure | None = None) -> np.ndarray:
    from scipy.optimize import least_squares

    st = structure or Structure.select("free", free, space)
    if st.design.shape[1] == 0:
        return space.prior.copy()
    data_residuals = _data_residuals(sets, space, skip)

    def f(x: np.ndarray) -> np.ndarray:
        return np.concatenate([data_residuals(st.theta(space, x)), x / st.prior_sd])

    # Start a tenth of a prior sd inside the bounds: scipy's trust region does not leave a start on a bound
    # (a zero instruction cost, the prior on GPUs) and stops at once.
    margin = 0.1 * st.prior_sd
    x0 = np.clip(np.zeros(len(st.prior_sd)), st.lower + margin, st.upper - margin)
    res = least_squares(f, x0, bounds=(st.lower, st.upper), diff_step=1e-3, max_nfev=MAX_EVALUATIONS,
                        x_scale=st.prior_sd)
    return st.theta(space, res.x)


def _posterior_sd(sets: Sequence[MeasuredSet], space: ParameterSpace, theta: np.ndarray,
                  skip: tuple[int, int] | None) -> np.ndarray:
    """Gauss–Newton posterior sd of every parameter at ``theta`` (prior included)."""
    f = _residuals(sets, space, skip)
    r0 = f(theta)
    n_data = len(r0) - len(theta)
    jac = np.empty((n_data, len(theta)))
    for j in range(len(theta)):
        h = 1e-3 * max(1.0, abs(theta[j]))
        t = theta.copy()
        t[j] += h
        if t[j] > space.upper[j]:
            t[j] = theta[j] - h
            h = -h
        jac[:, j] = (f(t)[:n_data] - r0[:n_data]) / h
    precision = jac.T @ jac + np.diag(1.0 / space.prior_sd ** 2)
    return np.sqrt(np.diag(np.linalg.pinv(precision)))


def _parameters(fit: FitResult) -> tuple[FittedParameter, ...]:
    sp = fit.space
    out = []
    for i, name in enumerate(sp.names):
        kind, _, key = name.partition(":")
        out.append(FittedParameter(name=f"{kind}[{key}]" if key else kind, value=sp.shown(i, fit.theta[i]),
                                   prior=sp.shown(i, sp.prior[i]), fitted=fit.identified[i],
                                   posterior_sd=float(fit.posterior_sd[i]), moved=fit.free[i]))
    return tuple(out)


# --- the calibrated per-layer table -----------------------------------------------------------------------------
def base_layer_table(model: Model, cluster: Cluster, base: Profile | None, global_batch: int) -> LayerTable:
    """The per-layer times the cost model would use, for every GPU type × tp × mbs the next search may need."""
    types = {g.name: g for g in cluster.gpu_types()}
    table: LayerTable = {}
    for name, gpu in types.items():
        tps = dict(_tp_bandwidths(cluster, name).items())
        mbss = set(_divisors(global_batch))
        if base is not None:
            tps.update({tp: tps.get(tp, math.inf) for tp in base.tps(model.name, name) if tp not in tps})
            mbss |= {s.mbs for k, samples in base.table.items() if k[0] == model.name and k[1] == name
                     for s in samples}
        for tp, bw in sorted(tps.items()):
            for mbs in sorted(mbss):
                lt = layer_times(model, gpu, tp, mbs, base, bw, cluster.latency_s, types)
                table[(name, tp, mbs)] = (lt.forward_s, lt.backward_s, lt.source)
    return table


def time_factor(params: CalibrationParams, device: str, mbs: int) -> float:
    """The multiplier on one GPU type's per-layer times at micro-batch ``mbs``."""
    return params.compute_factor.get(device, 1.0) * mbs ** (-params.mbs_exponent)


def scaled_profile(table: LayerTable, model_name: str, params: CalibrationParams | float) -> Profile:
    """An in-memory :class:`Profile` of ``table`` with the calibration applied (a float: one compute factor)."""
    if not isinstance(params, CalibrationParams):
        params = CalibrationParams(compute_factor={dev: float(params) for dev, _, _ in table})
    per_layer: dict[tuple[str, str, int, int], list[ProfileSample]] = {}
    for (dev, tp, mbs), (fwd, bwd, _) in table.items():
        c = time_factor(params, dev, mbs)
        for layer in range(len(fwd)):
            per_layer.setdefault((model_name, dev, tp, layer), []).append(
                ProfileSample(mbs, float(fwd[layer]) * c, float(bwd[layer]) * c))
    frozen = {k: tuple(sorted(v, key=lambda s: s.mbs)) for k, v in per_layer.items()}
    return Profile(source="calibrated", table=frozen, calibration=params)


def profile_csv(table: LayerTable, model_name: str, params: CalibrationParams, base: str) -> tuple[str, int]:
    """The calibrated profile as CSV text (the format :func:`ampe.costmodel.profile.load_profile` reads)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(PROFILE_COLUMNS)
    n = 0
    for (dev, tp, mbs), (fwd, bwd, source) in sorted(table.items()):
        c = time_factor(params, dev, mbs)
        for layer in range(len(fwd)):
            w.writerow([model_name, dev, tp, mbs, layer, f"{fwd[layer] * c:.9g}", f"{bwd[layer] * c:.9g}",
                        f"{c:.6g}", source if base == "roofline" else f"{base} ({source})"])
            n += 1
    return buf.getvalue(), n


def _tp_bandwidths(cluster: Cluster, gpu_name: str) -> dict[int, float]:
    """Tensor-parallel degrees possible inside one node of this GPU type → slowest link among the first tp GPUs."""
    out: dict[int, float] = {}
    for ids in cluster.node_devices().values():
        ids = [i for i in ids if cluster.devices[i].gpu.name == gpu_name]
        for tp in _divisors(len(ids)) if ids else ():
            sub = cluster.bandwidth[np.ix_(ids[:tp], ids[:tp])]
            bw = float(sub[~np.eye(tp, dtype=bool)].min()) if tp > 1 else math.inf
            out[tp] = min(out.get(tp, math.inf), bw) if tp > 1 else math.inf
    return out or {1: math.inf}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
