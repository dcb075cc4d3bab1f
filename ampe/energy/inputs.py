"""Plain per-stage inputs of the energy planner and their DAG under the analytic DVFS model.

The planner does not depend on the cost model: it takes per-stage forward/backward seconds per micro-batch at
f_max, per-boundary P2P seconds and the GPU type of every stage. :func:`inputs_from_estimate` adapts the cost
model's ``Estimate`` (``fwd_s``/``bwd_s`` indexed [replica][stage], ``p2p_s`` indexed [replica][boundary]).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ampe.costmodel.catalog import GpuType
from ampe.costmodel.schedules import BACKWARD, FORWARD
from ampe.costmodel.stage_energy import ClockOption
from ampe.energy import budget, dvfs
from ampe.energy.model_options import model_options
from ampe.energy.pipeline_dag import build_dag
from ampe.tradeoff.dag import ComputationDag
from ampe.tradeoff.options import OpOptions, Option

if TYPE_CHECKING:
    from ampe.costmodel.cluster import Cluster
    from ampe.costmodel.estimate import Estimate


@dataclass(frozen=True)
class PipelineInputs:
    """One pipeline replica: times per micro-batch at f_max (s), GPU type and GPU count of every stage."""

    fwd_s: tuple[float, ...]
    bwd_s: tuple[float, ...]
    gpus: tuple[GpuType, ...]
    num_microbatches: int
    p2p_forward_s: tuple[float, ...] = ()  # per boundary b (stage b → b+1); empty: no transfers
    p2p_backward_s: tuple[float, ...] | None = None  # per boundary (b+1 → b); None: same as forward
    gpus_per_stage: tuple[int, ...] = ()  # tensor-parallel GPUs per stage; empty: 1 each
    schedule: str = "1f1b"
    virtual_stages: int = 1  # interleaved 1F1B: the per-stage tuples are per virtual stage (chunk · N + stage)
    # Measured energy (ampe.costmodel.stage_energy), per stage; empty or an empty entry: the DVFS model.
    measured: tuple[tuple[ClockOption, ...], ...] = ()  # per-clock options (all the stage's GPUs)
    power_scale: tuple[float, ...] = ()  # measured / modelled power at the default clock (after the activity)
    activity: tuple[float, ...] = ()  # per stage, from its measured power at the default clock; empty: 1 each
    # per stage: its power at f_max (activity, scale) is modelled from its kernels (ampe.costmodel.kernel_energy),
    # not measured; empty: none is
    kernel_power: tuple[bool, ...] = ()
    # Per device stage: what a joule there is worth relative to the others (its site's price or carbon intensity ×
    # PUE, ampe.energy.price): the DAG's energies and blocking powers are multiplied by it, so a frontier traced on
    # it trades time against money or CO2e. Empty: 1 each (plain joules).
    energy_weight: tuple[float, ...] = ()

    def source(self, stage: int) -> str:
        """Where stage ``stage``'s options come from: ``measured``, ``scaled`` (the DVFS model at the profile's
        measured power), ``kernels`` (at the power modelled from its kernels) or ``model``."""
        if self.measured and self.measured[stage]:
            return "measured"
        if self.kernel_power and self.kernel_power[stage]:
            return "kernels"
        scaled = (self.power_scale and self.power_scale[stage] != 1.0) or (self.activity
                                                                         and self.activity[stage] != 1.0)
        return "scaled" if scaled else "model"

    def __post_init__(self) -> None:
        n = len(self.fwd_s)
        if not (len(self.bwd_s) == len(self.gpus) == n) or n == 0:
            raise ValueError("fwd_s, bwd_s and gpus need one entry per stage")
        if self.p2p_forward_s and len(self.p2p_forward_s) != n - 1:
            raise ValueError("p2p_forward_s needs one entry per boundary")
        if self.gpus_per_stage and len(self.gpus_per_stage) != n:
            raise ValueError("gpus_per_stage needs one entry per stage")
        if not all(0 <= t < math.inf for t in (*self.fwd_s, *self.bwd_s, *self.p2p_forward_s)):  # NaN fails too
            raise ValueError("times must be finite and non-negative")
        if self.energy_weight and (len(self.energy_weight) != self.num_stages
                                   or not all(0 <= w < math.inf for w in self.energy_weight)):
            raise ValueError("energy_weight needs one finite, non-negative entry per device stage")

    @property
    def num_stages(self) -> int:
        """Number of pipeline stages (devices); the tuples hold num_stages × virtual_stages entries."""
        return len(self.fwd_s) // self.virtual_stages

    def stage_gpus(self, stage: int) -> int:
        """GPUs working on ``stage`` (its tensor-parallel degree)."""
        return self.gpus_per_stage[stage] if self.gpus_per_stage else 1


def dag_from_inputs(inputs: PipelineInputs, margin: float = 0.0) -> ComputationDag:
    """The computation DAG with DVFS-model options over each stage's catalog clocks (``margin``: the planning guard
    band of :func:`~ampe.energy.model_options.model_options`; 0 = the model as it is)."""
    specs = []
    blocking = []
    for v, gpu in enumerate(inputs.gpus):
        k = inputs.stage_gpus(v)
        weight = inputs.energy_weight[v % inputs.num_stages] if inputs.energy_weight else 1.0
        if inputs.measured and inputs.measured[v]:
            ms = inputs.measured[v]
            specs.append({FORWARD: _scaled(OpOptions(tuple(Option(float(o.mhz), o.forward_s, o.forward_j)
                                                           for o in ms)), weight),
                          BACKWARD: _scaled(OpOptions(tuple(Option(float(o.mhz), o.backward_s, o.backward_j)
                                                            for o in ms)), weight)})
        else:
            scale = (inputs.power_scale[v] if inputs.power_scale else 1.0) * weight
            act = inputs.activity[v] if inputs.activity else 1.0
            specs.append({FORWARD: _scaled(model_options(gpu, inputs.fwd_s[v], k, margin=margin, act=act), scale),
                          BACKWARD: _scaled(model_options(gpu, inputs.bwd_s[v], k, margin=margin, act=act), scale)})
        if v < inputs.num_stages:  # chunks of one device share its waiting power
            blocking.append(k * dvfs.blocking_power_w(gpu) * weight)
    return build_dag(specs, inputs.num_microbatches, schedule=inputs.schedule, blocking_w=blocking,
                     p2p_forward_s=inputs.p2p_forward_s or None,
                     p2p_backward_s=inputs.p2p_backward_s if inputs.p2p_forward_s else None,
                     virtual_stages=inputs.virtual_stages)


def _scaled(options: OpOptions, scale: float) -> OpOptions:
    """``options`` with every energy × ``scale`` (the measured/modelled power ratio, times the stage's energy
    weight)."""
    if scale == 1.0:
        return options
    return OpOptions(tuple(Option(o.mhz, o.time_s, o.energy_j * scale) for o in options.options))


def power_scales(gpus: Sequence[GpuType], default_energy: Sequence[tuple[float, float] | None]
                 ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per stage (activities, power scales) from measured default-clock (joules, seconds) of one GPU: the stage's
    activity and the factor on its modelled power (:func:`ampe.energy.dvfs.measured_activity`; docs/energy.md §1,
    "Measured profiles override the model"); (1.0, 1.0) where nothing was measured."""
    acts, scales = [], []
    for gpu, m in zip(gpus, default_energy, strict=False):
        a, k = dvfs.measured_activity(gpu, m[0] / m[1]) if m is not None and m[1] > 0 and m[0] > 0 else (1.0, 1.0)
        acts.append(a)
        scales.append(k)
    return tuple(acts), tuple(scales)


def inputs_from_estimate(estimate: Estimate, replica: int, gpus: Sequence[GpuType], num_microbatches: int, *,
                         tp: int = 1, schedule: str = "1f1b", virtual_stages: int = 1) -> PipelineInputs:
    """Inputs of data-parallel ``replica`` from a cost-model ``Estimate``.

    ``gpus[s]`` is the GPU type of stage s of that replica (e.g. of its first tensor-parallel shard; a mixed-type
    tensor-parallel group is modelled with that one type). ``estimate.p2p_s[replica][b]`` is used for both the
    activation and the gradient transfer across boundary b. With interleaving (``virtual_stages`` > 1) the estimate
    is per virtual stage and ``gpus`` may list the device stages only; they repeat for every chunk.
    """
    if virtual_stages > 1 and len(gpus) * virtual_stages == len(estimate.fwd_s[replica]):
        gpus = tuple(gpus) * virtual_stages
    p2p = tuple(float(x) for x in getattr(estimate, "p2p_s", [()] * (replica + 1))[replica])
    measured = tuple(getattr(estimate, "clock_options", ()) or ())
    default = tuple(getattr(estimate, "default_energy", ()) or ())
    kernel = tuple(getattr(estimate, "kernel_energy", ()) or ())
    at_fmax, modelled = _power_at_fmax(default[replica] if default else (), kernel[replica] if kernel else (),
                                       len(gpus))
    acts, scales = power_scales(gpus, at_fmax) if any(at_fmax) else ((), ())
    return PipelineInputs(
        fwd_s=tuple(float(x) for x in estimate.fwd_s[replica]),
        bwd_s=tuple(float(x) for x in estimate.bwd_s[replica]),
        gpus=tuple(gpus),
        num_microbatches=num_microbatches,
        p2p_forward_s=p2p,
        gpus_per_stage=(tp,) * len(gpus),
        schedule=schedule,
        virtual_stages=virtual_stages,
        measured=measured[replica] if measured and any(measured[replica]) else (),
        power_scale=scales,
        activity=acts,
        kernel_power=modelled if any(modelled) else (),
    )


def _power_at_fmax(measured: tuple, kernels: tuple, n: int) -> tuple[tuple, tuple[bool, ...]]:
    """Per stage, its (joules, seconds) at f_max: the profile's measured figure, else the one modelled from its
    kernels, else None; and which came from the kernels."""
    out, from_kernels = [], []
    for v in range(n):
        m = measured[v] if v < len(measured) else None
        k = kernels[v] if v < len(kernels) else None
        out.append(m if m is not None else k)
        from_kernels.append(m is None and k is not None)
    return tuple(out), tuple(from_kernels)


# the Estimate's per-replica fields inputs_from_estimate reads: replicas equal in all of them have equal inputs
_PER_REPLICA = ("fwd_s", "bwd_s", "p2p_s", "clock_options", "default_energy", "kernel_energy")


def replica_inputs(estimate: Estimate, cluster: Cluster) -> tuple[PipelineInputs, ...]:
    """Every data-parallel replica's planner inputs from a cost-model ``Estimate`` (GPU types from
    ``Estimate.stage_gpu``, else each stage's first device in the cluster). Replicas with the same figures share one
    inputs object (built once: thousands of replicas at 16,384 GPUs, a few distinct)."""
    s = estimate.strategy
    types = {g.name: g for g in cluster.gpu_types()}
    n_pos = s.pp * s.virtual_stages
    shares = s.shares
    built: dict[tuple, PipelineInputs] = {}
    out = []
    for r in range(s.dp):
        if estimate.stage_gpu:
            gpus = [types[name] for name in estimate.stage_gpu[r]]
        else:
            gpus = [cluster.devices[s.device(p % s.pp, r, 0)].gpu for p in range(n_pos)]
        key = (tuple(g.name for g in gpus), shares[r], *(_replica_row(estimate, field, r) for field in _PER_REPLICA))
        if key not in built:
            built[key] = inputs_from_estimate(estimate, r, gpus, shares[r], tp=s.tp, schedule=s.schedule,
                                              virtual_stages=s.virtual_stages)
        out.append(built[key])
    return tuple(out)


def _replica_row(estimate: Estimate, field: str, r: int) -> Any:
    """Replica ``r``'s row of one of the estimate's per-replica fields (None where the field is empty)."""
    rows = getattr(estimate, field, ()) or ()
    return rows[r] if r < len(rows) else None


def energy_source(inputs: Sequence[PipelineInputs]) -> str:
    """How the figures were obtained: measured per-clock profile rows, the DVFS model with its power rescaled to the
    profile's default-clock energy, or the analytic DVFS model (CPUs flagged: no energy counter here)."""
    kinds = {i.source(v) for i in inputs for v in range(len(i.gpus))}
    if kinds == {"measured"}:
        return "measured (per-clock profile: ampe profile --clocks)"
    derived = _derived_notes(inputs)
    parts = []
    if "measured" in kinds:
        parts.append("measured per-clock profile where it covers a stage")
    if "scaled" in kinds:
        parts.append("DVFS model rescaled to the profile's default-clock energy")
    if "kernels" in kinds and parts:
        parts.append("DVFS model at the power modelled from the kernels' bounds (fitted at f_max only)")
    if parts:
        return ("mixed: " + "; ".join(parts) + ("; DVFS model elsewhere" if "model" in kinds else "")
                + "".join(f"; {n}" for n in derived))
    notes = [*derived]
    if "kernels" in kinds:  # no measurement: the power at f_max from the kernels' bounds, the DVFS shape below it
        notes.insert(0, "power at f_max from the kernels' bounds, fitted at f_max only"
                     + ("" if kinds == {"kernels"} else " where the GPU type has it"))
    if any(g.name == "cpu" for i in inputs for g in i.gpus):
        notes.append("cpu: no energy counter, parameters assumed")
    return "modelled (analytic DVFS model" + "".join(f"; {n}" for n in notes) + ")"


def _derived_notes(inputs: Sequence[PipelineInputs]) -> list[str]:
    """"TYPE: derived from BASE …" for every GPU type of ``inputs`` whose DVFS model is a catalog type's scaled to
    its TDP (:func:`ampe.energy.dvfs.derived_params`), in order of first appearance."""
    seen: dict[str, str] = {}
    for i in inputs:
        for g in i.gpus:
            if g.name not in seen:
                src = dvfs.params_for(g).source
                seen[g.name] = f"{g.name}: {src}" if src.startswith("derived from") else ""
    return [n for n in seen.values() if n]


def inputs_key(i: PipelineInputs) -> tuple:
    """Everything that sets a replica's DAG and frontier: equal keys, one DAG and one frontier."""
    return (i.fwd_s, i.bwd_s, tuple(g.name for g in i.gpus), i.num_microbatches, i.p2p_forward_s,
            i.p2p_backward_s, i.gpus_per_stage, i.schedule, i.virtual_stages, i.measured, i.power_scale,
            i.activity, i.energy_weight, i.kernel_power)


def job_of(index: int, estimate: Estimate, cluster: Cluster) -> budget.Job:
    """The work figures of a costed strategy for :mod:`ampe.energy.budget`, without building its DAG."""
    s = estimate.strategy
    inputs = replica_inputs(estimate, cluster)
    distinct = {inputs_key(i): i for i in inputs}
    nodes = sum(budget.dag_nodes(s.pp, i.num_microbatches, s.virtual_stages, any(t > 0 for t in i.p2p_forward_s))
                for i in distinct.values())
    gpus = {g.name: g for i in distinct.values() for g in i.gpus}
    ratio = max((budget.slowdown_ratio(g) for g in gpus.values()), default=1.0)
    clocks = max((len(g.sm_clocks_mhz()) for g in gpus.values()), default=1)
    label = f"pp{s.pp}·dp{s.dp}·tp{s.tp}·mbs{s.mbs}, {s.gas} micro-batches"
    computations = budget.dag_nodes(s.pp, s.gas, s.virtual_stages, transfers=False)
    return budget.Job(index, nodes, ratio, clocks, float(estimate.iteration_s), label, computations)
