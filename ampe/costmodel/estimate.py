"""Strategy → :class:`Estimate`: iteration time, throughput, per-stage times and per-device memory.

Decomposition (AMP Eq. 4, made heterogeneity-aware)::

    iteration = max_r pipeline_r + max_j (dp_sync_j + tied_sync_j + optimizer_j)

After the pipeline drains, every stage all-reduces its gradients and steps its optimizer; the iteration ends when the
slowest stage's tail is done.

* ``pipeline_r`` — replica r's pipeline (Eq. 5, or the schedule simulation; on 1F1B with transfers that block both
  stages, :mod:`ampe.costmodel.pipeline`), with stage j's compute on *that replica's* devices: the slowest GPU type
  of the stage's tensor-parallel group sets its pace, and transfers use the real links between the two stages'
  shards, shared with the boundary's other flows (:func:`~ampe.costmodel.comm.pipe_transfer_s`). Heterogeneous
  replicas give different pipeline times; the slowest wins.
* ``dp_sync_j`` — ring all-reduce of stage j's gradients (params/tp × grad bytes) over its data-parallel ring in
  rank order, at that ring's slowest hop; the slowest shard's ring counts. Not overlapped with compute.
* ``tied_sync_j`` — DeepSpeed all-reduces tied weights' gradients between the stages that hold them.
* ``optimizer_j`` — the Adam step streams stage j's state bytes through memory, read and written once
  (memory-bound), on the stage's slowest device.

The tail terms are written once in :mod:`ampe.costmodel.tail` (the DP's stage tables use them too); what the cost
model keeps across strategies is :class:`~ampe.costmodel.caches.CostCaches`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

from ampe.costmodel.caches import (
    CostCaches,
    LayerTimesKey,
    LayoutKey,
    SegmentKey,
    StageMemoryKey,
    TimingKey,
    degrees_key,
)
from ampe.costmodel.calibration import calibrated_cluster
from ampe.costmodel.catalog import GpuType
from ampe.costmodel.cluster import Cluster
from ampe.costmodel.comm import pipe_transfer_s
from ampe.costmodel.compute import LayerTimes, attention_share, layer_times, recompute_layer_times
from ampe.costmodel.kernel_energy import BusyCache, strategy_kernel_energy
from ampe.costmodel.layout import DeviceLayout, DeviceTypes, device_layout, signature, stage_types, swap_stages
from ampe.costmodel.memory import (
    GiB,
    Placed,
    StageMemory,
    combine_chunks,
    layer_activation_bytes,
    layer_state_bytes,
    placed_memory,
    stage_memory,
    state_bytes_per_param,
)
from ampe.costmodel.model import Model, cut_sharded
from ampe.costmodel.pipeline import instruction_overhead_s, replica_pipelines, shared_iteration_s
from ampe.costmodel.profile import Profile
from ampe.costmodel.stage_energy import ClockOption, measured_energy
from ampe.costmodel.strategy import Strategy, complete
from ampe.costmodel.tail import (
    dp_sync_s,
    optimizer_seconds_per_param,
    optimizer_step_s,
    tied_groups,
    tied_layers,
    tied_ring_sets,
    tied_sync_s,
)
from ampe.formats.plan import Caveat


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
    max_memory_bytes: int  # the largest footprint (allocated + fragmentation + context) of any device
    fits: bool  # every device: footprint + reserve ≤ capacity (ampe.costmodel.memory)
    oom_reason: str | None  # the first device whose footprint exceeds its capacity (None: every one is within)
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
    # Modelled energy at f_max from the stage's kernels (ampe.costmodel.kernel_energy), [replica][position]:
    # (joules, seconds) of one micro-batch where the pace-setting GPU type has a fitted power by kernel bound
    kernel_energy: tuple[tuple[tuple[float, float] | None, ...], ...] = field(default=(), repr=False)
    # The first device whose footprint is within capacity but not within its reserve of it (the strategy is at
    # risk of running out of memory); None when every device fits with margin, or some device does not fit at all
    memory_risk: str | None = None

    @property
    def caveats(self) -> tuple[Caveat, ...]:
        """What the cost model says may keep the strategy from running as planned: its memory at risk
        (:attr:`memory_risk`); the plan adds whether the runtime can run it (``ampe.search.plan``)."""
        return (Caveat(kind="memory_at_risk", note=self.memory_risk),) if self.memory_risk is not None else ()

    @property
    def within_capacity(self) -> bool:
        """Whether every device's footprint is within its capacity: the strategy fits, or is at risk
        (:attr:`memory_risk`); the search keeps these and prunes the rest."""
        return self.oom_reason is None

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
            "memory_risk": self.memory_risk,
            "method": self.method,
            "compute_source": self.compute_source,
            "shared_processor_s": self.shared_processor_s,
            "memory_breakdown": [m.to_dict() for m in self.memory_breakdown],
        }


class Timing(NamedTuple):
    """The time terms of one estimate (:meth:`CostModel._timing`): seconds, per replica class where 2-D."""

    iteration: float
    lay: DeviceLayout
    fwd: np.ndarray
    bwd: np.ndarray
    p2p: np.ndarray
    pace: list[tuple[str, ...]]
    sources: set[str]
    pipe: list[float]  # [replica] pipeline seconds with the replica's own micro-batches (Strategy.shares)
    dp_sync: np.ndarray
    tied: np.ndarray
    opt: np.ndarray
    tail: np.ndarray
    shared: float
    p2p_back: np.ndarray  # p2p where a gradient crosses the boundary, else 0
    sent: list[bool]  # [boundary] whether a gradient crosses it


class CostModel:
    """Costs strategies on one (cluster, model, profile); keeps per-layer tables and recent terms across
    strategies in ``caches`` (:class:`~ampe.costmodel.caches.CostCaches`)."""

    def __init__(self, cluster: Cluster, model: Model, profile: Profile | None = None) -> None:
        self._inputs = (cluster, profile)  # as given: a variant's sibling is built from these (calibrated once)
        if profile is not None and profile.calibration is not None:
            cluster = calibrated_cluster(cluster, profile.calibration)  # a calibrated profile's sidecar
        self.cluster = cluster
        self.model = model
        self.profile = None if profile is None else profile.for_model(model)  # the model's attention kernel's rows
        self._types = {g.name: g for g in cluster.gpu_types()}
        self.caches = CostCaches()
        self._act_bytes_out = np.array([l.out_elems for l in model.layers], dtype=float) * model.bytes_per_elem
        self._slowness = {g.name: float(self.layer_times(g, 1, 1).total_s.sum()) for g in self._types.values()}
        self._device_types: DeviceTypes | None = None
        self._busy: BusyCache = {}  # running busy seconds by kernel bound (ampe.costmodel.kernel_energy)
        # (attention, dtype, tf32) -> cost model of that variant of the model, shared by the siblings
        self._variants: dict[tuple[str, str, bool], CostModel] = {(model.attention, model.dtype, model.tf32): self}

    # --- cached per-layer tables --------------------------------------------------------------------------
    def layer_times(self, gpu: GpuType, tp: int, mbs: int, tp_bandwidth: float = float("inf"),
                    recompute: str = "none") -> LayerTimes:
        """Per-layer forward/backward seconds for one micro-batch on one tp rank of ``gpu``; the backward includes
        ``recompute``'s extra forward work, measured where the profile has the layer under ``recompute``
        (:func:`ampe.costmodel.compute.recompute_layer_times`)."""
        key = LayerTimesKey(gpu.name, tp, mbs, tp_bandwidth, recompute)
        hit = self.caches.times.get(key)
        if hit is None:
            if recompute == "none":
                hit = layer_times(self.model, gpu, tp, mbs, self.profile, tp_bandwidth, self.cluster.latency_s,
                                  self._types)
            else:
                base = self.layer_times(gpu, tp, mbs, tp_bandwidth)
                share = attention_share(self.model, gpu, tp, mbs) if recompute == "selective" else None
                hit = recompute_layer_times(self.model, base, recompute, self.profile, gpu.name, tp, mbs, share)
            self.caches.times[key] = hit
        return hit

    def _layer_times_key(self, gpu: GpuType, tp: int, mbs: int, tp_bandwidth: float, recompute: str = "none"
                         ) -> LayerTimesKey:
        """:meth:`layer_times` filled in the cache; returns its key (for :meth:`_segment_sums`)."""
        self.layer_times(gpu, tp, mbs, tp_bandwidth, recompute)
        return LayerTimesKey(gpu.name, tp, mbs, tp_bandwidth, recompute)

    def _segment_sums(self, key: LayerTimesKey, a: int, b: int) -> tuple[float, float]:
        """Forward and backward seconds of layers a..b-1 under the layer times of ``key`` (cached: candidates share
        most stages; summed exactly as the per-layer arrays' slices would be)."""
        k = SegmentKey(key, a, b)
        hit = self.caches.segments.get(k)
        if hit is None:
            lt = self.caches.times[key]
            hit = self.caches.segments.put(k, (float(lt.forward_s[a:b].sum()), float(lt.backward_s[a:b].sum())))
        return hit

    def _frozen_prefix(self) -> np.ndarray:
        """(L+1,) bool: whether every layer before cut c is frozen."""
        frozen = [layer.frozen for layer in self.model.layers]
        return self.caches.cached(("frozen_prefix",),
                                  lambda: np.array([all(frozen[:c]) for c in range(len(frozen) + 1)]))

    def layer_states(self, tp: int, zero: int = 0, dp: int = 1) -> np.ndarray:
        """(L,) weight+grad+optimizer bytes per layer on one tp rank (ZeRO-1 over ``dp`` when ``zero``)."""
        # dp matters with ZeRO and, without it, at bf16 (DeepSpeed's BF16_Optimizer partitions its fp32 states)
        key = (tp, zero, dp if zero or self.model.dtype == "bf16" else 1)
        hit = self.caches.states.get(key)
        if hit is None:
            hit = self.caches.states[key] = layer_state_bytes(self.model, tp, zero, dp)
        return hit

    def layer_activations(self, gpu: GpuType, tp: int, mbs: int, recompute: str = "none") -> np.ndarray:
        """(L,) activation bytes per micro-batch per layer under ``recompute`` (measured where the profile has
        memory_bytes: under ``recompute`` itself, else without recomputation scaled by the analytic ratio)."""
        key = (gpu.name, tp, mbs, recompute)
        hit = self.caches.acts.get(key)
        if hit is None:
            measured = measured_rec = None
            if self.profile is not None:
                n, name = self.model.num_layers, self.model.name
                measured = _measured_bytes([self.profile.layer_memory(name, gpu.name, tp, i, mbs) for i in range(n)])
                if recompute != "none":
                    got = [self.profile.recompute_sample(name, gpu.name, tp, i, mbs, recompute) for i in range(n)]
                    measured_rec = _measured_bytes([None if s is None else s.memory_bytes for s in got])
            mask = gpu.mask_bytes(self.model.bytes_per_elem)
            hit = self.caches.acts[key] = layer_activation_bytes(self.model, tp, mbs, measured, mask,
                                                                 recompute, measured_rec)
        return hit

    def transfer_bytes(self, cut: int, mbs: int) -> float:
        """Bytes of one activation (or its gradient) crossing a cut before layer ``cut``, per micro-batch."""
        return float(self._act_bytes_out[cut - 1]) * mbs

    def slowness(self, gpu_name: str) -> float:
        """GPU type ``gpu_name``'s total layer time at tp=1, mbs=1 on this model (s; 0 for a type not here)."""
        return self._slowness.get(gpu_name, 0.0)

    # --- per-candidate device maps ------------------------------------------------------------------------
    def device_types(self) -> DeviceTypes:
        """The cluster's GPU types as indices (built once)."""
        if self._device_types is None:
            self._device_types = DeviceTypes.of(self.cluster, self._slowness)
        return self._device_types

    def layout(self, s: Strategy) -> DeviceLayout:
        """Device maps of ``s``'s degrees and placement as arrays (cached: the stage tables and every re-costed
        partition of one candidate share them)."""
        assert s.placement is not None
        key = LayoutKey(s.pp, s.dp, s.tp, s.placement)
        hit = self.caches.layouts.get(key)
        if hit is None:
            hit = self.caches.layouts.put(key, device_layout(self.cluster, self.device_types(), *key))
        return hit

    def swapped_layout(self, lay: DeviceLayout, s: Strategy, a: int, b: int) -> DeviceLayout:
        """``layout(s)`` where ``s``'s placement is ``lay``'s with the device blocks of stages ``a`` and ``b``
        swapped, derived from ``lay`` (:func:`~ampe.costmodel.layout.swap_stages`: the same arrays) and cached as
        :meth:`layout` caches."""
        assert s.placement is not None
        key = LayoutKey(s.pp, s.dp, s.tp, s.placement)
        hit = self.caches.layouts.get(key)
        if hit is None:
            hit = self.caches.layouts.put(key, swap_stages(lay, a, b))
        return hit

    def stage_types(self, s: Strategy) -> tuple[tuple[int, ...], ...]:
        """``layout(s).stage_types`` (the GPU type indices on each stage), from the cached layout when there is one,
        else without building it (the memory check needs only these)."""
        assert s.placement is not None
        key = LayoutKey(s.pp, s.dp, s.tp, s.placement)
        hit = self.caches.layouts.get(key)
        if hit is not None:
            return hit.stage_types
        return self.caches.stage_types.get_or_make(key, lambda: stage_types(self.device_types(), key.pp,
                                                                            key.placement))

    def cost_signature(self, s: Strategy) -> bytes | None:
        """A digest equal for two placements of ``s``'s degrees only when they get the same stage tables and the same
        iteration time and per-stage memory for every partition (the device ids in per-device figures and OOM
        messages aside): the local search skips a placement equal to one it has costed. None where the digest would
        not cover every term: devices time-sharing processors, or tied weights whose stages could fall in too many
        ways (more than :data:`~ampe.costmodel.tail.TIED_RING_SETS`)."""
        rings = self.caches.cached(("tied_rings", s.pp, s.virtual_stages),
                                   lambda: tied_ring_sets(self.model, s.pp, s.virtual_stages))
        if self.cluster.processor is not None or rings is None:
            return None
        return signature(self.layout(s), rings)

    # --- one strategy -------------------------------------------------------------------------------------
    def iteration_time(self, strategy: Strategy, method: str = "eq5") -> float:
        """``estimate(strategy, method).iteration_s`` without the memory terms and the Estimate (the same
        arithmetic: equal to the last bit), for ranking partitions before checking which fit. The terms behind it
        are kept for the last :data:`~ampe.costmodel.caches.TIMINGS` strategies, so that :meth:`estimate` of one of
        them reuses them (the cost model does not change after it is built: the same terms)."""
        if not self.runs_as_model(strategy):
            return self.for_strategy(strategy).iteration_time(strategy, method)
        s = complete(strategy, self.model.num_layers)
        return self.caches.timings.put(TimingKey(s, method), self._timing(s, method)).iteration

    def class_pipeline_s(self, strategy: Strategy, replica_class: int, gas: int, method: str = "eq5") -> float:
        """Pipeline seconds of ``strategy``'s replicas of class ``replica_class`` (``layout(s).replica_class``) were
        they to run ``gas`` micro-batches: the per-micro-batch terms (cached) are the same whatever the shares, so
        only the pipeline is re-run (what the share choice, ``ampe.search.shares``, weighs)."""
        s = complete(strategy, self.model.num_layers)
        if not self.runs_as_model(s):
            return self.for_strategy(s).class_pipeline_s(s, replica_class, gas, method)
        key = TimingKey(s, method)
        tm = self.caches.timings.get(key) or self.caches.timings.put(key, self._timing(s, method))
        return replica_pipelines(tm.fwd, tm.bwd, tm.p2p, tm.p2p_back, tm.sent, np.array([replica_class]), (gas,),
                                 s.schedule, s.virtual_stages, method)[0]

    def runs_as_model(self, s: Strategy) -> bool:
        """Whether ``s`` runs with this model's attention kernel and precision, TF32 included (or names none)."""
        return (s.attention in (None, self.model.attention) and s.dtype in (None, self.model.dtype)
                and s.tf32 in (None, self.model.tf32))

    def for_strategy(self, s: Strategy) -> CostModel:
        """The cost model of the model variant ``s`` runs (its attention kernel and precision): this one, or a
        sibling on the same cluster and profile (made once). ValueError for a variant that cannot be built."""
        if self.runs_as_model(s):
            return self
        key = (s.attention or self.model.attention, s.dtype or self.model.dtype,
               self.model.tf32 if s.tf32 is None else s.tf32)
        sib = self._variants.get(key)
        if sib is None:
            sib = CostModel(self._inputs[0], self.model.variant(*key), self._inputs[1])
            sib._variants = self._variants
            self._variants[key] = sib
        return sib

    def estimate(self, strategy: Strategy, method: str = "eq5") -> Estimate:
        """Predict iteration time and memory of ``strategy``; one that names another attention kernel or precision
        is costed on that variant (:meth:`for_strategy`).

        Args:
            strategy: validated beforehand (degrees, placement on this cost model's cluster); defaults (partition,
                placement) filled here.
            method: the pipeline time: ``eq5`` (AMP's Eq. 5) or ``simulate`` (the schedule simulated).

        Returns:
            The estimate: iteration time and its parts (s), per-device memory (B), throughput (samples/s).
        """
        if not self.runs_as_model(strategy):
            return self.for_strategy(strategy).estimate(strategy, method)
        s = complete(strategy, self.model.num_layers)
        tm = self.caches.timings.get(TimingKey(s, method))
        if tm is None:
            tm = self._timing(s, method)
        iteration, lay, fwd, bwd, p2p, pace = tm.iteration, tm.lay, tm.fwd, tm.bwd, tm.p2p, tm.pace
        dp_sync, tied, opt, tail = tm.dp_sync, tm.tied, tm.opt, tm.tail
        cls = lay.replica_class
        mem = self._memory(s, lay)
        stage_times = tuple(float(x) for x in (fwd + bwd).max(axis=0))
        clock_opts, default_j = measured_energy(self.profile, self.model, s, pace, fwd, bwd)  # per replica class
        kernel_j = strategy_kernel_energy(self.model, self._types, self._busy, s, pace, fwd, bwd)

        def per_replica(rows: np.ndarray) -> tuple[tuple[float, ...], ...]:
            # one tuple per class, shared by its replicas (thousands of replicas stay cheap to hold)
            uniq = [tuple(map(float, row)) for row in rows]
            return tuple(uniq[c] for c in cls)

        return Estimate(
            strategy=s,
            iteration_s=float(iteration),
            samples_per_s=float(s.gbs / iteration) if iteration > 0 else float("inf"),
            stage_times_s=stage_times,
            fwd_s=per_replica(fwd),
            bwd_s=per_replica(bwd),
            p2p_s=per_replica(p2p),
            pipeline_s=tuple(tm.pipe),
            dp_sync_s=float(dp_sync.max()),
            tied_sync_s=float(tied.max()),
            optimizer_s=float(opt.max()),
            tail_s=tuple(map(float, tail)),
            memory_bytes_per_stage=mem.per_stage,
            memory_bytes_per_device=mem.per_device,
            max_memory_bytes=max(mem.per_device),
            fits=mem.oom_reason is None and mem.risk is None,
            oom_reason=mem.oom_reason,
            method=method,
            compute_source="+".join(sorted(tm.sources)),
            stage_gpu=tuple(pace[c] for c in cls),
            shared_processor_s=tm.shared,
            memory_breakdown=mem.breakdown,
            memory_risk=mem.risk if mem.oom_reason is None else None,
            clock_options=tuple(clock_opts[c] for c in cls) if clock_opts else (),
            default_energy=tuple(default_j[c] for c in cls) if default_j else (),
            kernel_energy=tuple(kernel_j[c] for c in cls) if kernel_j else (),
        )

    def _timing(self, s: Strategy, method: str) -> Timing:
        """Iteration time of a completed strategy and the terms behind it (see :meth:`estimate`)."""
        assert s.partition is not None and s.placement is not None
        cl, model = self.cluster, self.model
        lay = self.layout(s)
        n_pos = s.pp * s.virtual_stages
        # Replicas with the same pace-setters and links have the same pipeline: cost one of each class.
        n_cls = len(lay.class_replica)
        fwd = np.zeros((n_cls, n_pos))
        bwd = np.zeros((n_cls, n_pos))
        p2p = np.zeros((n_cls, max(n_pos - 1, 0)))
        pace: list[tuple[str, ...]] = []
        sources: set[str] = set()
        stage_of = [pos % s.pp for pos in range(n_pos)]
        segments = list(itertools.pairwise(s.partition))
        cuts = np.array(s.partition[1:-1], dtype=np.int64)
        # bytes of the tensor crossing each cut on one tensor-parallel rank (before DeepSpeed splits it over them)
        nbytes = self.caches.cached(("cut_nbytes", s.tp, s.mbs), lambda: np.array(
            [0.0] + [self.transfer_bytes(b, s.mbs) / (s.tp if cut_sharded(model, b) else 1)
                     for b in range(1, model.num_layers)]))[cuts]
        for c, (stage_lt, op_s, names, link, srcs) in enumerate(self._class_terms(s, lay)):
            sums = [self._segment_sums(stage_lt[j], a, b) for j, (a, b) in zip(stage_of, segments, strict=True)]
            sources.update(srcs)
            f_sum, b_sum = np.array(sums).reshape(n_pos, 2).T
            fwd[c] = f_sum + op_s  # CPU: measured per-instruction overhead; GPUs: 0
            bwd[c] = np.where(b_sum > 0, b_sum + op_s, b_sum + 0.0)
            pace.append(names)
            if link is not None:
                p2p[c] = pipe_transfer_s(nbytes, s.tp, link[0], link[1], cl.latency_s)
        frozen_before = self._frozen_prefix()[cuts]
        # A gradient is sent back across a cut only if something before the cut trains.
        p2p_back = p2p * np.where(frozen_before, 0.0, 1.0)[None, :] if n_pos > 1 else p2p
        sent = [not f for f in frozen_before.tolist()]
        cls = lay.replica_class
        pipe = replica_pipelines(fwd, bwd, p2p, p2p_back, sent, cls, s.shares, s.schedule, s.virtual_stages, method)
        params = [self._device_stage_params(s, j) for j in range(s.pp)]
        dp_sync = dp_sync_s(s, model, cl.latency_s, lay, params)
        tied = tied_sync_s(s, model, cl.latency_s, lay, self.tied_groups(s))
        opt = optimizer_step_s(s, model.dtype, lay, self.device_types().gpus, params)
        tail = dp_sync + tied + opt
        iteration = max(pipe) + float(tail.max())  # the gradient all-reduce waits for the slowest replica
        shared = 0.0
        if cl.processor is not None and s.schedule in ("1f1b", "gpipe") and s.virtual_stages == 1:
            shared = self._shared_processors(s, fwd[cls], bwd[cls], p2p[cls], p2p_back[cls], dp_sync + tied, opt, sent)
            iteration = shared
        return Timing(float(iteration), lay, fwd, bwd, p2p, pace, sources, pipe, dp_sync, tied, opt, tail, shared,
                      p2p_back, sent)

    def _class_terms(self, s: Strategy, lay: DeviceLayout) -> list[tuple[list, np.ndarray, tuple[str, ...],
                                                                           np.ndarray | None, set[str]]]:
        """Per replica class of ``lay``: each device stage's layer-times key, each position's per-instruction
        overhead, pace-setter names, each boundary's (2, boundaries) flow bandwidth and the slower tensor-parallel
        ring beside it (:func:`~ampe.costmodel.comm.pipe_transfer_s`), and the compute sources: what :meth:`_timing`
        needs besides
        the partition, kept on the layout (the keys per (tp, mbs, recomputation), the rest per chunks; the whole
        answer per (chunks, tp, mbs, recomputation of each stage): the partitions of one candidate share it)."""
        n_pos = s.pp * s.virtual_stages
        done = ("class_terms", n_pos, s.tp, s.mbs, s.recompute, s.stage_recompute)
        terms = lay.memo.get(done)
        if terms is not None:
            return terms
        base = lay.memo.get(("class_base", n_pos))
        if base is None:
            gpus = self.device_types().gpus
            stage_of = [pos % s.pp for pos in range(n_pos)]
            base = []
            for r in lay.class_replica.tolist():
                stage_gpu = [gpus[t] for t in lay.pace[:, r].tolist()]
                op_s = np.array([instruction_overhead_s(stage_gpu[j].pipeline_op_s, n_pos) for j in stage_of])
                link = np.stack(lay.boundary_links(r))[:, stage_of[:-1]] if n_pos > 1 else None
                base.append((stage_gpu, lay.tp_ring[:, r].tolist(), op_s, tuple(stage_gpu[j].name for j in stage_of),
                             link))
            lay.memo[("class_base", n_pos)] = base

        def keys(rec: str) -> list[list]:  # [class][stage] layer-times keys with every stage under ``rec``
            got = lay.memo.get(("class_keys", s.tp, s.mbs, rec))
            if got is None:
                got = lay.memo[("class_keys", s.tp, s.mbs, rec)] = [
                    [self._layer_times_key(g, s.tp, s.mbs, bw_, rec) for g, bw_ in zip(gpus_, rings, strict=True)]
                    for gpus_, rings, *_ in base]
            return got

        if s.stage_recompute is None:
            per_class = keys(s.recompute)
        else:
            by_rec = {rec: keys(rec) for rec in set(s.stage_recompute)}
            per_class = [[by_rec[rec][c][j] for j, rec in enumerate(s.stage_recompute)] for c in range(len(base))]
        terms = lay.memo[done] = [(stage_lt, op_s, names, link, {self.caches.times[k].source for k in set(stage_lt)})
                                  for stage_lt, (_, _, op_s, names, link) in zip(per_class, base, strict=True)]
        return terms

    def _shared_processors(self, s: Strategy, fwd: np.ndarray, bwd: np.ndarray, p2p: np.ndarray,
                           p2p_back: np.ndarray, sync: np.ndarray, opt: np.ndarray, sent: list[bool]) -> float:
        """Iteration seconds when devices time-share processors (cluster ``processors:``): every replica's pipeline
        simulated together with each processor shared among the computations on it
        (:func:`ampe.costmodel.pipeline.simulate_shared`, at the node's ``sharing_efficiency``), then the tail — per
        processor, the slowest gradient all-reduce of its ranks and their optimizer steps together."""
        procs = self.cluster.processor
        assert procs is not None
        groups = [[[procs[s.device(j, r, k)] for k in range(s.tp)] for j in range(s.pp)] for r in range(s.dp)]
        return shared_iteration_s(fwd, bwd, p2p, p2p_back, s.shares, groups, s.schedule,
                                  self.cluster.processor_efficiency, sync, opt, sent)

    def _device_stage_params(self, s: Strategy, dev_stage: int) -> float:
        """Trainable parameters one tensor-parallel rank of device stage ``dev_stage`` holds (all its chunks)."""
        assert s.partition is not None
        total: float = 0
        for pos in range(dev_stage, s.pp * s.virtual_stages, s.pp):
            key = (s.partition[pos], s.partition[pos + 1], s.tp)
            hit = self.caches.params.get(key)
            if hit is None:
                hit = self.caches.params[key] = self.model.stage_params(range(key[0], key[1]), s.tp,
                                                                        trainable_only=True)
            total += hit
        return total

    def _device_memory(self, s: Strategy, base: tuple, dev_stage: int, gpu: GpuType) -> tuple[StageMemory, int]:
        """Memory of one tensor-parallel rank of ``dev_stage`` on a ``gpu`` device (all its chunks) and its total in
        bytes; cached on (``base`` = :func:`degrees_key` of ``s`` with its memory options, stage, chunks, GPU type):
        candidates of one degrees tuple and their re-costed partitions share most stages."""
        assert s.partition is not None
        chunks = tuple((s.partition[pos], s.partition[pos + 1])
                       for pos in range(dev_stage, s.pp * s.virtual_stages, s.pp))
        key = StageMemoryKey(base, dev_stage, chunks, gpu.name)  # base holds the memory options too
        hit = self.caches.stage_memory.get(key)
        if hit is None:
            states = self.layer_states(s.tp, s.zero, s.dp)
            rec = s.recompute_at(dev_stage)
            acts = self.layer_activations(gpu, s.tp, s.mbs, rec)
            mem = combine_chunks([stage_memory(self.model, range(a, b), dev_stage, s.pp, s.tp, s.mbs, s.gas, gpu,
                                               s.schedule, s.virtual_stages, layer_states=states, layer_acts=acts,
                                               recompute=rec, zero=s.zero, dp=s.dp,
                                               expandable=s.expandable_segments) for a, b in chunks])
            hit = self.caches.stage_memory.put(key, (mem, int(mem.total)))
        return hit

    def tied_groups(self, s: Strategy) -> dict[str, tuple[list[int], float]]:
        """Tied-weight groups spread over several stages: name → (device stages, tied params per tp rank)
        (:func:`ampe.costmodel.tail.tied_groups`)."""
        return tied_groups(self.model, s, self.caches.cached(("tied_layers",), lambda: tied_layers(self.model)))

    def optimizer_seconds_per_param(self, gpu: GpuType, zero: int = 0, dp: int = 1) -> float:
        """Seconds per trainable parameter of one Adam step on ``gpu`` (every state byte read and written once);
        ZeRO-1 steps only the rank's 1/dp partition."""
        return optimizer_seconds_per_param(gpu, self.model.dtype, zero, dp)

    def _memory(self, s: Strategy, lay: DeviceLayout) -> Placed:
        """The placed strategy's footprints and breakdowns: :func:`ampe.costmodel.memory.placed_memory`. Under
        uneven shares a replica's devices hold what they would under equal shares of its own micro-batches."""
        if s.replica_gas is None:
            base = degrees_key(s)
            return placed_memory(s.pp, lay, self.device_types().gpus, self.cluster,
                                 lambda j, gpu, _: self._device_memory(s, base, j, gpu))
        each = {g: replace(s, gbs=g * s.dp * s.mbs, replica_gas=None) for g in set(s.shares)}
        keys = {g: degrees_key(e) for g, e in each.items()}
        return placed_memory(s.pp, lay, self.device_types().gpus, self.cluster,
                             lambda j, gpu, g: self._device_memory(each[g], keys[g], j, gpu), s.shares)


def _measured_bytes(values: list[float | None]) -> np.ndarray | None:
    """(L,) measured bytes with NaN where a layer has none; None when no layer has any."""
    if all(v is None for v in values):
        return None
    return np.array([np.nan if v is None else v for v in values])


def estimate(cluster: Cluster, model: Model, strategy: Strategy, profile: Profile | None = None,
             method: str = "eq5") -> Estimate:
    """Predict one strategy's iteration time (s), throughput (samples/s) and per-device memory (bytes)."""
    return CostModel(cluster, model, profile).estimate(strategy, method)


__all__ = ["CostModel", "Estimate", "GiB", "estimate", "state_bytes_per_param"]
