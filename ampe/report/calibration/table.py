"""The per-layer table a calibration scales: the per-layer times the cost model used for every GPU type × tp × mbs
the next search may need (the plan's profile where it covers a layer, the roofline elsewhere, as
:func:`ampe.costmodel.compute.layer_times` derives them), as an in-memory profile under fitted parameters and as the
profile CSV ``ampe report --calibrate`` writes."""

from __future__ import annotations

import csv
import io
import math

import numpy as np

from ampe.costmodel.cluster import Cluster
from ampe.costmodel.compute import layer_times
from ampe.costmodel.model import Model
from ampe.costmodel.profile import Profile, ProfileSample
from ampe.formats.calibration import CalibrationParams

PROFILE_COLUMNS = ("model", "device", "tp", "mbs", "layer", "forward_s", "backward_s", "calibration_factor",
                   "base_source")

# (device, tp, mbs) → (forward per layer, backward per layer, source), seconds for one micro-batch on one tp rank
LayerTable = dict[tuple[str, int, int], tuple[np.ndarray, np.ndarray, str]]


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
