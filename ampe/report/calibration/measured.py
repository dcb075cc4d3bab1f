"""What a calibration is fitted on: the inputs the cost model predicted the measured strategies from, the measured
strategies themselves with the per-layer table the calibration scales, and their predicted seconds under a set of
parameters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from ampe.costmodel.cluster import Cluster, load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.model import Model
from ampe.costmodel.profile import Profile
from ampe.costmodel.strategy import Strategy
from ampe.errors import InputError
from ampe.formats.calibration import CalibrationParams
from ampe.report.calibration.table import LayerTable, base_layer_table, scaled_profile
from ampe.trials.planfile import TrialPlan

Point = tuple[int, int]  # a measured strategy: (set, index)


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


def as_frozen(inputs: CalibrationInputs, named: Sequence[int | None], where: str) -> CalibrationInputs:
    """``inputs`` with the model's frozen prefix as the measured strategies trained it: ``named`` holds each one's
    ``frozen_layers`` (None: as ``inputs`` say, the plan's prefix for a trials folder, none for a measurements
    file). One prefix per calibration, as :func:`as_ran` keeps one kernel: strategies trained with several are
    refused (the per-layer table the fit scales is of one model)."""
    have = sum(1 for layer in inputs.model.layers if layer.frozen)
    ks = {have if k is None else k for k in named}
    if len(ks) > 1:
        raise InputError(where, "strategy.frozen_layers", f"the measured strategies trained with several frozen "
                         f"prefixes ({', '.join(map(str, sorted(ks)))} layers): calibrate each set on its own")
    (k,) = ks or {have}
    if k == have:
        return inputs
    if not 0 <= k <= inputs.model.num_layers:
        raise InputError(where, "strategy.frozen_layers", f"{k} frozen layers but {inputs.model.name} has "
                         f"{inputs.model.num_layers}")
    return replace(inputs, model=inputs.model.with_frozen_prefix(k))


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


def without(sets: Sequence[MeasuredSet], skip: tuple[int, int]) -> list[MeasuredSet]:
    """``sets`` without strategy ``skip`` = (set, index)."""
    out = []
    for k, d in enumerate(sets):
        idx = [i for i in range(len(d.strategies)) if (k, i) != skip]
        out.append(MeasuredSet(d.inputs, d.table, tuple(d.strategies[i] for i in idx), d.measured_s[idx]))
    return out


def only(data: MeasuredSet, i: int) -> MeasuredSet:
    return MeasuredSet(data.inputs, data.table, (data.strategies[i],), data.measured_s[i:i + 1])
