"""Strategy → :class:`Estimate`: iteration time, throughput, per-stage times and per-device memory.

Decomposition (AMP Eq. 4, made heterogeneity-aware)::

    iteration = max_r pipeline_r + max_j (dp_sync_j + tied_sync_j + optimizer_j)

After the pipeline drains, every stage all-reduces its gradients and steps its optimizer; the iteration ends when the
slowest stage's tail is done.

* ``pipeline_r`` — replica r's pipeline (Eq. 5, or the schedule simulation), with stage j's compute on *that
  replica's* devices: the slowest GPU type of the stage's tensor-parallel group sets its pace, and transfers use the
  real links between the two stages' shards. Heterogeneous replicas give different pipeline times; the slowest wins.
* ``dp_sync_j`` — ring all-reduce of stage j's gradients (params/tp × grad bytes) over its data-parallel ring in
  rank order, at that ring's slowest hop; the slowest shard's ring counts. Not overlapped with compute.
* ``tied_sync_j`` — DeepSpeed all-reduces tied weights' gradients between the stages that hold them.
* ``optimizer_j`` — the Adam step streams stage j's state bytes through memory, read and written once
  (memory-bound), on the stage's slowest device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ampe.costmodel.calibration import calibrated_cluster
from ampe.costmodel.catalog import GpuType
from ampe.costmodel.cluster import Cluster
from ampe.costmodel.comm import group_link_bandwidth, p2p_time, ring_allreduce_time, ring_bandwidth
from ampe.costmodel.compute import LayerTimes, layer_times, recompute_extra_s
from ampe.costmodel.memory import (
    GiB,
    StageMemory,
    layer_activation_bytes,
    layer_state_bytes,
    stage_memory,
    state_bytes_per_param,
)
from ampe.costmodel.model import Model
from ampe.costmodel.pipeline import eq5, simulate, simulate_shared
from ampe.costmodel.profile import Profile
from ampe.costmodel.stage_energy import ClockOption, stage_clock_options, stage_default_energy
from ampe.costmodel.strategy import Strategy, complete
from ampe.costmodel.tables import GRAD_BYTES, StageTables, cut_sharded, instruction_overhead_s, stage_tables


@dataclass(frozen=True)
class Estimate:
    """Predicted cost of one strategy. Times in seconds, memory in bytes."""

    strategy: Strategy
    iteration_s: float
    samples_per_s: float
    stage_times_s: tuple[float, ...]  # forward+backward of one micro-batch per stage, slowest replica
    fwd_s: tuple[tuple[float, ...], ...]  # [replica][stage] forward seconds per micro-batch
    bwd_s: tuple[tuple[float, ...], ...]  # [replica][stage] backward seconds per micro-batch
    p2p_s: tuple[tuple[float, ...], ...]  # [replica][boundary] one transfer (activation or gradient), seconds
    pipeline_s: tuple[float, ...]  # [replica]
    dp_sync_s: float  # max over stages
    tied_sync_s: float  # max over stages
    optimizer_s: float  # max over stages
    tail_s: tuple[float, ...]  # [stage] dp_sync + tied_sync + optimizer after the pipeline drains
    memory_bytes_per_stage: tuple[int, ...]  # peak over the stage's devices
    memory_bytes_per_device: tuple[int, ...]  # indexed by device id
    max_memory_bytes: int
    fits: bool
    oom_reason: str | None
    method: str = "eq5"
    compute_source: str = "roofline"
    stage_gpu: tuple[tuple[str, ...], ...] = field(default=())  # [replica][stage] GPU type setting the pace
    # Devices time-sharing processors (cluster `processors:`): the iteration simulated with processor sharing (which
    # then is iteration_s); 0 when every device has a processor of its own
    shared_processor_s: float = 0.0
    memory_breakdown: tuple[StageMemory, ...] = field(default=())  # [stage] the stage's fullest device, by component
    # Measured energy from the profile (ampe.costmodel.stage_energy), [replica][position]: per-clock options of the
    # stage, and (joules, seconds) at the default clock; empty without energy in the profile.
    clock_options: tuple[tuple[tuple[ClockOption, ...], ...], ...] = field(default=(), repr=False)
    default_energy: tuple[tuple[tuple[float, float] | None, ...], ...] = field(default=(), repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (the `ampe evaluate --json` record)."""
        return {
            "strategy": self.strategy.to_dict(),
            "iteration_s": self.iteration_s,
            "samples_per_s": self.samples_per_s,
            "stage_times_s": list(self.stage_times_s),
            "pipeline_s": list(self.pipeline_s),
            "dp_sync_s": self.dp_sync_s,
            "tied_sync_s": self.tied_sync_s,
            "optimizer_s": self.optimizer_s,
            "tail_s": list(self.tail_s),
            "max_memory_bytes": self.max_memory_bytes,
            "memory_bytes_per_stage": list(self.memory_bytes_per_stage),
            "fits": self.fits,
            "oom_reason": self.oom_reason,
            "method": self.method,
            "compute_source": self.compute_source,
            "shared_processor_s": self.shared_processor_s,
            "memory_breakdown": [m.to_dict() for m in self.memory_breakdown],
        }


class CostModel:
    """Costs strategies on one (cluster, model, profile); caches per-layer tables across strategies."""

    def __init__(self, cluster: Cluster, model: Model, profile: Profile | None = None) -> None:
        if profile is not None and profile.calibration is not None:
            cluster = calibrated_cluster(cluster, profile.calibration)  # a calibrated profile's sidecar
        self.cluster = cluster
        self.model = model
        self.profile = profile
        self._types = {g.name: g for g in cluster.gpu_types()}
        self._times: dict[tuple[str, int, int, float, str], LayerTimes] = {}
        self._states: dict[tuple[int, int, int], np.ndarray] = {}
        self._acts: dict[tuple[str, int, int, str], np.ndarray] = {}
        self._act_bytes_out = np.array([l.out_elems for l in model.layers], dtype=float) * model.bytes_per_elem
        # Slowness of each GPU type on this model (total layer time at tp=1, mbs=1): picks a stage's pace-setter.
        self._slowness = {g.name: float(self.layer_times(g, 1, 1).total_s.sum()) for g in self._types.values()}

    # --- cached per-layer tables --------------------------------------------------------------------------
    def layer_times(self, gpu: GpuType, tp: int, mbs: int, tp_bandwidth: float = float("inf"),
                    recompute: str = "none") -> LayerTimes:
        """Per-layer forward/backward seconds for one micro-batch on one tp rank of ``gpu``; the backward includes
        ``recompute``'s extra forward work (:func:`ampe.costmodel.compute.recompute_extra_s`)."""
        key = (gpu.name, tp, mbs, tp_bandwidth, recompute)
        hit = self._times.get(key)
        if hit is None:
            if recompute == "none":
                hit = layer_times(self.model, gpu, tp, mbs, self.profile, tp_bandwidth, self.cluster.latency_s,
                                  self._types)
            else:
                base = self.layer_times(gpu, tp, mbs, tp_bandwidth)
                hit = LayerTimes(base.forward_s, base.backward_s + recompute_extra_s(self.model, base.forward_s,
                                                                                     recompute), base.source)
            self._times[key] = hit
        return hit

    def layer_states(self, tp: int, zero: int = 0, dp: int = 1) -> np.ndarray:
        """(L,) weight+grad+optimizer bytes per layer on one tp rank (ZeRO-1 over ``dp`` when ``zero``)."""
        key = (tp, zero, dp if zero else 1)
        hit = self._states.get(key)
        if hit is None:
            hit = self._states[key] = layer_state_bytes(self.model, tp, zero, dp)
        return hit

    def layer_activations(self, gpu: GpuType, tp: int, mbs: int, recompute: str = "none") -> np.ndarray:
        """(L,) activation bytes per micro-batch per layer (measured where the profile has memory_bytes)."""
        key = (gpu.name, tp, mbs, recompute)
        hit = self._acts.get(key)
        if hit is None:
            measured = None
            if self.profile is not None:
                vals = [self.profile.layer_memory(self.model.name, gpu.name, tp, i, mbs)
                        for i in range(self.model.num_layers)]
                if any(v is not None for v in vals):
                    measured = np.array([np.nan if v is None else v for v in vals])
            hit = self._acts[key] = layer_activation_bytes(self.model, tp, mbs, measured, gpu.dropout_mask_bytes,
                                                           recompute)
        return hit

    def transfer_bytes(self, cut: int, mbs: int) -> float:
        """Bytes of one activation (or its gradient) crossing a cut before layer ``cut``, per micro-batch."""
        return float(self._act_bytes_out[cut - 1]) * mbs

    def slowest_gpu(self, devices: tuple[int, ...]) -> GpuType:
        """The slowest GPU type among ``devices`` (by the model's total layer time at tp=1, mbs=1)."""
        gpus = [self.cluster.devices[d].gpu for d in devices]
        return max(gpus, key=lambda g: (self._slowness[g.name], g.name))

    def stage_tables(self, strategy: Strategy) -> StageTables:
        """The layer-assignment DP's per-stage cost tables of ``strategy`` (its partition is ignored; see
        :mod:`ampe.costmodel.tables`)."""
        return stage_tables(self, strategy)

    # --- one strategy -------------------------------------------------------------------------------------
    def estimate(self, strategy: Strategy, method: str = "eq5") -> Estimate:
        """Predict iteration time and memory of ``strategy`` (validated beforehand; defaults filled here)."""
        s = complete(strategy, self.model.num_layers)
        assert s.partition is not None and s.placement is not None
        cl, model = self.cluster, self.model
        bw = cl.bandwidth
        n_pos = s.pp * s.virtual_stages
        fwd = np.zeros((s.dp, n_pos))
        bwd = np.zeros((s.dp, n_pos))
        p2p = np.zeros((s.dp, max(n_pos - 1, 0)))
        pace: list[list[str]] = []
        sources: set[str] = set()
        for r in range(s.dp):
            pace_r = []
            for pos in range(n_pos):
                dev_stage = pos % s.pp
                devs = s.stage_devices(dev_stage, r)
                gpu = self.slowest_gpu(devs)
                tp_bw = ring_bandwidth(bw, devs)
                lt = self.layer_times(gpu, s.tp, s.mbs, tp_bw, s.recompute)
                sources.add(lt.source)
                a, b = s.partition[pos], s.partition[pos + 1]
                fwd[r, pos] = lt.forward_s[a:b].sum()
                bwd[r, pos] = lt.backward_s[a:b].sum()
                op_s = instruction_overhead_s(gpu.pipeline_op_s, n_pos)  # CPU: measured; GPUs: 0
                fwd[r, pos] += op_s
                bwd[r, pos] += op_s if bwd[r, pos] > 0 else 0.0
                pace_r.append(gpu.name)
                if pos < n_pos - 1:
                    nxt = s.stage_devices((pos + 1) % s.pp, r)
                    link = group_link_bandwidth(bw, devs, nxt)
                    nbytes = self.transfer_bytes(b, s.mbs) / (s.tp if cut_sharded(self.model, b) else 1)
                    p2p[r, pos] = p2p_time(nbytes, link, cl.latency_s) if link != float("inf") else 0.0
            pace.append(pace_r)
        frozen_before = [all(l.frozen for l in model.layers[: s.partition[pos + 1]]) for pos in range(n_pos - 1)]
        # A gradient is sent back across a cut only if something before the cut trains.
        p2p_back = p2p * np.array([0.0 if fz else 1.0 for fz in frozen_before])[None, :] if n_pos > 1 else p2p
        if method == "simulate":
            pipes = [simulate(fwd[r], bwd[r], p2p[r], p2p_back[r], s.gas, s.schedule, s.virtual_stages).makespan_s
                     for r in range(s.dp)]
        else:
            pipes = [self._closed_form(fwd[r], bwd[r], p2p[r] + p2p_back[r], s) for r in range(s.dp)]
        dp_sync = self._dp_sync(s)
        tied = self._tied_sync(s)
        opt = self._optimizer_step(s)
        tail = dp_sync + tied + opt
        iteration = max(pipes) + float(tail.max())
        shared = 0.0
        if cl.processor is not None and s.schedule in ("1f1b", "gpipe") and s.virtual_stages == 1:
            shared = self._shared_processors(s, fwd, bwd, p2p, p2p_back, dp_sync + tied, opt)
            iteration = shared
        mem_stage, mem_dev, reason, breakdown = self._memory(s)
        stage_times = tuple(float(x) for x in (fwd + bwd).max(axis=0))
        clock_opts, default_j = self._measured_energy(s, pace, fwd, bwd)
        return Estimate(
            strategy=s,
            iteration_s=float(iteration),
            samples_per_s=float(s.gbs / iteration) if iteration > 0 else float("inf"),
            stage_times_s=stage_times,
            fwd_s=tuple(tuple(map(float, row)) for row in fwd),
            bwd_s=tuple(tuple(map(float, row)) for row in bwd),
            p2p_s=tuple(tuple(map(float, row)) for row in p2p),
            pipeline_s=tuple(map(float, pipes)),
            dp_sync_s=float(dp_sync.max()),
            tied_sync_s=float(tied.max()),
            optimizer_s=float(opt.max()),
            tail_s=tuple(map(float, tail)),
            memory_bytes_per_stage=mem_stage,
            memory_bytes_per_device=mem_dev,
            max_memory_bytes=max(mem_dev),
            fits=reason is None,
            oom_reason=reason,
            method=method,
            compute_source="+".join(sorted(sources)),
            stage_gpu=tuple(tuple(p) for p in pace),
            shared_processor_s=shared,
            memory_breakdown=breakdown,
            clock_options=clock_opts,
            default_energy=default_j,
        )

    def _measured_energy(self, s: Strategy, pace: list[list[str]], fwd: np.ndarray, bwd: np.ndarray
                         ) -> tuple[tuple, tuple]:
        """Per replica and position: measured per-clock options and default-clock (joules, seconds) of the stage."""
        if self.profile is None or not self.profile.has_energy:
            return (), ()
        assert s.partition is not None
        opts, default = [], []
        for r, names in enumerate(pace):
            o_r, d_r = [], []
            for pos, gpu in enumerate(names):
                layers = range(s.partition[pos], s.partition[pos + 1])
                o_r.append(stage_clock_options(self.profile, self.model, gpu, s.tp, s.mbs, layers, s.tp,
                                               float(fwd[r, pos]), float(bwd[r, pos])))
                d_r.append(stage_default_energy(self.profile, self.model, gpu, s.tp, s.mbs, layers))
            opts.append(tuple(o_r))
            default.append(tuple(d_r))
        return tuple(opts), tuple(default)

    def _shared_processors(self, s: Strategy, fwd: np.ndarray, bwd: np.ndarray, p2p: np.ndarray,
                           p2p_back: np.ndarray, sync: np.ndarray, opt: np.ndarray) -> float:
        """Iteration seconds when devices time-share processors (cluster ``processors:``): every replica's pipeline
        simulated together with each processor shared among the computations on it
        (:func:`ampe.costmodel.pipeline.simulate_shared`, at the node's ``sharing_efficiency``), then the tail — per
        processor, the slowest gradient all-reduce of its ranks and their optimizer steps together."""
        procs = self.cluster.processor
        assert procs is not None
        groups = [[[procs[s.device(j, r, k)] for k in range(s.tp)] for j in range(s.pp)] for r in range(s.dp)]
        eff = self.cluster.processor_efficiency
        makespan = simulate_shared(fwd, bwd, p2p, p2p_back, s.gas, groups, s.schedule, eff)
        steps: dict[int, float] = {}
        ranks: dict[int, int] = {}
        comm: dict[int, float] = {}
        for r in range(s.dp):
            for j in range(s.pp):
                for p in groups[r][j]:
                    steps[p] = steps.get(p, 0.0) + float(opt[j])
                    ranks[p] = ranks.get(p, 0) + 1
                    comm[p] = max(comm.get(p, 0.0), float(sync[j]))
        # Optimizer steps of ranks sharing a processor overlap, so they run at its shared efficiency.
        return makespan + max(steps[p] / (eff[p] if eff is not None and ranks[p] > 1 else 1.0) + comm[p]
                              for p in steps)

    @staticmethod
    def _closed_form(fwd: np.ndarray, bwd: np.ndarray, transfers: np.ndarray, s: Strategy) -> float:
        if s.schedule == "interleaved" and s.virtual_stages > 1:
            # Each device runs v chunks; the fill/drain bubble shrinks by v (Narayanan et al. 2021).
            per_device = (fwd + bwd).reshape(s.virtual_stages, s.pp).sum(axis=0)
            return float(s.gas * per_device.max() + (per_device.sum() - per_device.max()) / s.virtual_stages
                         + transfers.sum())
        return eq5(fwd + bwd, transfers, s.gas)

    def _dp_sync(self, s: Strategy) -> np.ndarray:
        """[stage] seconds of the data-parallel gradient all-reduce (slowest shard's ring); with ZeRO-1 a
        reduce-scatter of the gradients and an all-gather of the updated bit16 weights, each half a ring
        all-reduce of its bytes."""
        out = np.zeros(s.pp)
        if s.dp < 2:
            return out
        assert s.partition is not None
        gb = GRAD_BYTES[self.model.dtype]
        for dev_stage in range(s.pp):
            params = sum(self.model.stage_params(range(s.partition[pos], s.partition[pos + 1]), s.tp,
                                                 trainable_only=True)
                         for pos in range(dev_stage, s.pp * s.virtual_stages, s.pp))
            for k in range(s.tp):
                ring = [s.device(dev_stage, r, k) for r in range(s.dp)]
                rbw = ring_bandwidth(self.cluster.bandwidth, ring)
                t = ring_allreduce_time(params * gb, s.dp, rbw, self.cluster.latency_s)
                if s.zero:
                    t = (t + ring_allreduce_time(params * self.model.bytes_per_elem, s.dp, rbw,
                                                 self.cluster.latency_s)) / 2
                out[dev_stage] = max(out[dev_stage], t)
        return out

    def tied_groups(self, s: Strategy) -> dict[str, tuple[list[int], float]]:
        """Tied-weight groups spread over several stages: name → (device stages, tied params per tp rank)."""
        assert s.partition is not None
        groups: dict[str, set[int]] = {}
        sizes: dict[str, float] = {}
        for pos in range(s.pp * s.virtual_stages):
            for i in range(s.partition[pos], s.partition[pos + 1]):
                layer = self.model.layers[i]
                if layer.tied and layer.trains_tied:
                    groups.setdefault(layer.tied, set()).add(pos % s.pp)
                    shard = s.tp if layer.tp_shardable else 1
                    sizes[layer.tied] = max(sizes.get(layer.tied, 0.0), layer.tied_params / shard)
        return {n: (sorted(st), sizes[n]) for n, st in groups.items() if len(st) > 1}

    def _tied_sync(self, s: Strategy) -> np.ndarray:
        """[stage] seconds of tied-weight gradient all-reduces between the stages that share a weight."""
        gb = GRAD_BYTES[self.model.dtype]
        out = np.zeros(s.pp)
        for stages, size in self.tied_groups(s).values():
            worst = 0.0
            for r in range(s.dp):
                for k in range(s.tp):
                    ring = [s.device(j, r, k) for j in stages]
                    worst = max(worst, ring_allreduce_time(size * gb, len(ring),
                                                           ring_bandwidth(self.cluster.bandwidth, ring),
                                                           self.cluster.latency_s))
            out[stages] += worst
        return out

    def optimizer_seconds_per_param(self, gpu: GpuType, zero: int = 0, dp: int = 1) -> float:
        """Seconds per trainable parameter of one Adam step on ``gpu`` (every state byte read and written once);
        ZeRO-1 steps only the rank's 1/dp partition."""
        share = dp if zero else 1
        return 2.0 * state_bytes_per_param(self.model.dtype) / share / (gpu.memory_bandwidth * gpu.memory_efficiency)

    def _optimizer_step(self, s: Strategy) -> np.ndarray:
        """[stage] seconds of the optimizer step on the stage's slowest device, with its per-iteration framework
        work (``GpuType.iteration_overhead_s``)."""
        assert s.partition is not None
        out = np.zeros(s.pp)
        for dev_stage in range(s.pp):
            params = sum(
                self.model.stage_params(range(s.partition[pos], s.partition[pos + 1]), s.tp, trainable_only=True)
                for pos in range(dev_stage, s.pp * s.virtual_stages, s.pp))
            for r in range(s.dp):
                gpu = self.slowest_gpu(s.stage_devices(dev_stage, r))
                out[dev_stage] = max(out[dev_stage], params * self.optimizer_seconds_per_param(gpu, s.zero, s.dp)
                                     + gpu.iteration_overhead_s)
        return out

    def _memory(self, s: Strategy) -> tuple[tuple[int, ...], tuple[int, ...], str | None, tuple[StageMemory, ...]]:
        assert s.partition is not None
        per_dev = [0] * self.cluster.size
        per_stage = []
        breakdown = []
        reason = None
        states = self.layer_states(s.tp, s.zero, s.dp)
        for dev_stage in range(s.pp):
            chunks = [range(s.partition[pos], s.partition[pos + 1])
                      for pos in range(dev_stage, s.pp * s.virtual_stages, s.pp)]
            worst = 0
            worst_mem: StageMemory | None = None
            for r in range(s.dp):
                for k in range(s.tp):
                    d = s.device(dev_stage, r, k)
                    gpu = self.cluster.devices[d].gpu
                    acts = self.layer_activations(gpu, s.tp, s.mbs, s.recompute)
                    parts = [stage_memory(self.model, c, dev_stage, s.pp, s.tp, s.mbs, s.gas, gpu, s.schedule,
                                          s.virtual_stages, layer_states=states, layer_acts=acts,
                                          recompute=s.recompute, zero=s.zero, dp=s.dp) for c in chunks]
                    mem = _combine(parts)
                    total = int(mem.total)
                    per_dev[d] = total
                    if worst_mem is None or total > worst:
                        worst_mem = mem
                    worst = max(worst, total)
                    if total > gpu.memory_bytes and reason is None:
                        reason = (f"stage {dev_stage} on device {d} ({self.cluster.devices[d].node}) "
                                  f"{mem.explain(gpu)}")
            per_stage.append(worst)
            assert worst_mem is not None
            breakdown.append(worst_mem)
        return tuple(per_stage), tuple(per_dev), reason, tuple(breakdown)


def _combine(parts: list[StageMemory]) -> StageMemory:
    """Memory of a device holding several model chunks (interleaved schedule): everything adds, reserved once."""
    if len(parts) == 1:
        return parts[0]
    return StageMemory(
        states=sum(p.states for p in parts),
        activations=sum(p.activations for p in parts),
        buffers=sum(p.buffers for p in parts),
        transient=max(p.transient for p in parts),
        reserved=parts[0].reserved,
        in_flight=parts[0].in_flight,
        optimizer_step=max(p.optimizer_step for p in parts),
        recompute=max(p.recompute for p in parts),
    )


def estimate(cluster: Cluster, model: Model, strategy: Strategy, profile: Profile | None = None,
             method: str = "eq5") -> Estimate:
    """Predict one strategy's iteration time (s), throughput (samples/s) and per-device memory (bytes)."""
    return CostModel(cluster, model, profile).estimate(strategy, method)


__all__ = ["CostModel", "Estimate", "GiB", "estimate", "state_bytes_per_param"]
