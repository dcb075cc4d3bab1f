"""Close the loop: measured trials → a calibrated per-layer profile CSV for the next ``ampe search --profile``.

The output is an ordinary profile (``model,device,tp,mbs,layer,forward_s,backward_s`` plus the ignored columns
``calibration_factor`` and ``base_source``): the per-layer times the cost model used for the plan (from the plan's
profile where it covers a layer, the roofline elsewhere, exactly as :func:`ampe.costmodel.compute.layer_times`
derives them), multiplied by one factor ``c``. ``c`` is fitted so the cost model, re-run on the measured strategies
with the scaled layer times, matches the measured iteration times best in the least-squares sense on log time::

    c = argmin_c Σ_strategies (log estimate_c(s) − log measured(s))²

Only compute is scaled; communication (p2p, all-reduce, tensor-parallel rings) keeps its bandwidth-matrix model,
so ``c`` is *not* simply the median measured/predicted ratio when communication matters.

Why one factor and not one per GPU type: a plan's strategies all use every device of the cluster, so every trial
mixes the same GPU types and the trials cannot tell the types' errors apart. Per-type factors need trials on
sub-clusters, which ``ampe trial`` does not run. The factor corrects the bias (MAPE); it changes the ranking only
through the compute/communication balance.

Rows are written for every GPU type of the cluster, every tensor-parallel degree that divides a node of that type
(and every degree in the base profile), and every micro-batch size that divides the global batch (and every size in
the base profile), so the next search finds calibrated times for all its candidates.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ampe.costmodel.cluster import Cluster, load_cluster
from ampe.costmodel.compute import layer_times
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.model import Model, load_model
from ampe.costmodel.profile import Profile, ProfileSample, load_profile
from ampe.costmodel.strategy import strategy_from_dict
from ampe.errors import InputError
from ampe.io import write_text_atomic
from ampe.report.compare import Report, mape

PROFILE_COLUMNS = ("model", "device", "tp", "mbs", "layer", "forward_s", "backward_s", "calibration_factor",
                   "base_source")
FACTOR_RANGE = (1e-3, 1e3)


@dataclass(frozen=True)
class Calibration:
    """The fitted factor and how well the cost model matches the measured strategies before and after it."""

    factor: float  # multiplier on every per-layer compute time
    median_ratio: float  # median measured / re-estimated time before calibration
    strategies: int  # measured strategies the fit used
    mape_before_pct: float  # cost model with the plan's inputs, on those strategies
    mape_after_pct: float  # with the calibrated profile (in-sample: the same strategies)
    rows: int  # rows written to the CSV
    base_source: str  # "profile <path> + roofline" or "roofline"
    method: str  # pipeline-time method used to re-estimate ("eq5" | "simulate")


def calibrate(report: Report, out_csv: str | Path) -> Calibration:
    """Fit the factor on the report's measured strategies and write the calibrated profile CSV."""
    plan = report.plan
    where = report.directory or "results folder"
    if plan is None:
        raise InputError(where, "plan.json", "missing: calibration needs the plan the trials came from")
    if not plan.cluster_spec:
        raise InputError(f"{where}/plan.json", "inputs.cluster_spec", "missing: calibration needs the cluster spec")
    cluster = load_cluster(plan.cluster_spec)
    model = load_model(plan.model)
    base = None
    if plan.profile:
        base = load_profile(plan.profile, known_devices=[g.name for g in cluster.gpu_types()])
    rows = [r for r in report.measured if not r.schedule_applied]
    if not rows:
        raise InputError(where, "results", "no measured trial without a frequency schedule to calibrate from")
    strategies = [strategy_from_dict(r.strategy, where) for r in rows]
    measured = np.array([r.measured_s for r in rows], dtype=float)
    method = str((plan.raw.get("search") or {}).get("method", "eq5"))
    if method not in ("eq5", "simulate"):
        method = "eq5"
    table = base_layer_table(model, cluster, base, plan.global_batch)
    trained = model.with_frozen_prefix(plan.frozen_layers) if plan.frozen_layers else model

    def estimates(c: float) -> np.ndarray:
        cm = CostModel(cluster, trained, scaled_profile(table, model.name, c))
        return np.array([cm.estimate(s, method).iteration_s for s in strategies])

    factor = fit_factor(estimates, measured)
    before, after = estimates(1.0), estimates(factor)
    text, n = profile_csv(table, model.name, factor, "roofline" if base is None else f"profile {plan.profile}")
    write_text_atomic(out_csv, text)
    return Calibration(
        factor=factor, median_ratio=float(np.median(measured / before)), strategies=len(rows),
        mape_before_pct=_mape(before, measured), mape_after_pct=_mape(after, measured), rows=n,
        base_source="roofline" if base is None else f"profile {plan.profile} + roofline", method=method)


def fit_factor(estimates, measured: np.ndarray) -> float:
    """The c in :data:`FACTOR_RANGE` minimising the squared log error of ``estimates(c)`` against ``measured``."""
    from scipy.optimize import minimize_scalar

    logm = np.log(measured)

    def loss(logc: float) -> float:
        return float(np.sum((np.log(estimates(math.exp(logc))) - logm) ** 2))

    lo, hi = (math.log(x) for x in FACTOR_RANGE)
    res = minimize_scalar(loss, bounds=(lo, hi), method="bounded", options={"xatol": 1e-4})
    return float(math.exp(res.x))


# (device, tp, mbs) → (forward per layer, backward per layer, source), seconds for one micro-batch on one tp rank
LayerTable = dict[tuple[str, int, int], tuple[np.ndarray, np.ndarray, str]]


def base_layer_table(model: Model, cluster: Cluster, base: Profile | None, global_batch: int) -> LayerTable:
    """The per-layer times the cost model would use, for every GPU type × tp × mbs the next search may need."""
    types = {g.name: g for g in cluster.gpu_types()}
    table: LayerTable = {}
    for name, gpu in types.items():
        tps = {tp: bw for tp, bw in _tp_bandwidths(cluster, name).items()}
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


def scaled_profile(table: LayerTable, model_name: str, factor: float) -> Profile:
    """An in-memory :class:`Profile` with every time of ``table`` multiplied by ``factor``."""
    per_layer: dict[tuple[str, str, int, int], list[ProfileSample]] = {}
    for (dev, tp, mbs), (fwd, bwd, _) in table.items():
        for layer in range(len(fwd)):
            per_layer.setdefault((model_name, dev, tp, layer), []).append(
                ProfileSample(mbs, float(fwd[layer]) * factor, float(bwd[layer]) * factor))
    frozen = {k: tuple(sorted(v, key=lambda s: s.mbs)) for k, v in per_layer.items()}
    return Profile(source=f"calibrated ×{factor:.4g}", table=frozen)


def profile_csv(table: LayerTable, model_name: str, factor: float, base: str) -> tuple[str, int]:
    """The calibrated profile as CSV text (the format :func:`ampe.costmodel.profile.load_profile` reads)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(PROFILE_COLUMNS)
    n = 0
    for (dev, tp, mbs), (fwd, bwd, source) in sorted(table.items()):
        for layer in range(len(fwd)):
            w.writerow([model_name, dev, tp, mbs, layer, f"{fwd[layer] * factor:.9g}", f"{bwd[layer] * factor:.9g}",
                        f"{factor:.6g}", source if base == "roofline" else f"{base} ({source})"])
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


def _mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    """MAPE (%) of a non-empty fit set (calibration needs at least one measured strategy)."""
    value = mape(predicted, measured)
    assert value is not None
    return value
