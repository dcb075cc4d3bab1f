"""Per-layer forward/backward time on one GPU type, for one micro-batch on one tensor-parallel rank.

Sources, in order of preference (the first that covers *every* layer of the model wins):

1. ``profile`` measured on this GPU type at this tp — used as is (tp communication was measured with it);
2. ``profile`` on this GPU type at tp = 1 — scaled by the roofline ratio roofline(tp)/roofline(1), plus the
   analytic tensor-parallel all-reduces;
3. ``profile`` of the same model on another GPU type — scaled per layer by roofline(this type)/roofline(that type)
   (the profiled type with most layers covered is the reference), plus analytic all-reduces when tp > 1;
4. the analytic roofline alone.

Roofline (docs/cost_model.md; the kernels are :mod:`ampe.costmodel.kernels`): a layer's time is the sum of its
kernels' times, each kernel at its own roofline — compute and memory traffic overlap inside a kernel, so it takes
the larger of the two (a hard max: no smooth transition near the ridge point)::

    gemm        = max(F / (peak · matmul_efficiency · u) + gemm_overhead_s,
                      bytes / (memory_bandwidth · memory_efficiency))
                  F: FLOPs of one call (2·batch·m·n·k for this micro-batch on this tp rank); u = unaligned_efficiency
                  when n or k is not a 16-byte multiple (16-bit only), else 1. The achieved efficiency,
                  matmul_efficiency · F / (F + F½) with F½ = gemm_overhead_s · peak · matmul_efficiency · u,
                  saturates once a GEMM is large, whichever of its dimensions makes it so
    elementwise = bytes / (memory_bandwidth · memory_efficiency)
    forward     = Σ gemm + Σ elementwise + layer_overhead_s
    backward    = Σ 2 · gemm (input and weight gradients; same FLOPs and bytes each)
                  + Σ 2 · weight bytes / (memory_bandwidth · memory_efficiency)   (the weight gradient's accumulation)
                  + Σ elementwise backward + layer_overhead_s                    (0 for frozen layers)

With FlashAttention a layer's attention GEMMs (QKᵀ, ·V) and the softmax between them are one kernel that never
writes the scores: forward F = both GEMMs (the causal mask's skipped half is not taken off: FlashAttention's
attention kernels run at about half the rate of a plain GEMM), bytes = Q, K, V read and the output written; backward
2.5 F (five GEMM-sized products: QKᵀ recomputed) and twice the bytes; the eager s² passes (scale, mask, softmax,
dropout) are not run. A layer without kernels (a model YAML gives FLOPs and activation bytes only) is one kernel:
F = its FLOPs, bytes = the activation bytes it keeps + its weights; backward twice that (plus QKᵀ again with
FlashAttention).

Activation recomputation adds to the backward (:func:`recompute_extra_s`, applied by the cost model), or, where the
profile measured the layer under that recomputation on this GPU type at this tp, the measured row replaces the layer's
times (:func:`recompute_layer_times`). A profile is read for the model's attention kernel
(:meth:`ampe.costmodel.profile.Profile.for_model`).

Tensor parallelism (Megatron): each transformer block does 2 all-reduces of ``mbs·s·h`` elements in forward and 2 in
backward over the tp group's ring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ampe.costmodel.catalog import CATALOG, GpuType
from ampe.costmodel.comm import ring_allreduce_time
from ampe.costmodel.kernels import Gemm
from ampe.costmodel.model import Layer, Model
from ampe.costmodel.profile import Profile


@dataclass(frozen=True, eq=False)
class LayerTimes:
    """Per-layer seconds for one micro-batch on one tp rank of one GPU type."""

    forward_s: np.ndarray  # (L,)
    backward_s: np.ndarray  # (L,)
    source: str  # "profile", "profile-tp1+roofline", "profile(<type>)+roofline" or "roofline"

    @property
    def total_s(self) -> np.ndarray:
        """Forward plus backward per layer."""
        return self.forward_s + self.backward_s


def gemm_seconds(flops: float, moved_bytes: float, gpu: GpuType, precision: str, aligned: bool = True) -> float:
    """Seconds of one matrix-product kernel of ``flops`` FLOPs moving ``moved_bytes`` bytes in ``precision``
    (:attr:`~ampe.costmodel.model.Model.gemm_precision`): the larger of its compute time at the saturating GEMM
    efficiency and its memory time (they overlap inside a kernel). A tensor-core product whose leading dimensions
    are not 16-byte multiples runs at ``unaligned_efficiency`` × that (16-bit), or on the SIMT cores at the fp32
    rate (TF32: cuBLAS has no unaligned TF32 tensor-core kernel to fall back to)."""
    if flops <= 0:
        return memory_seconds(moved_bytes, gpu)
    peak, eff = gpu.peak_flops(precision), gpu.matmul_efficiency
    if not aligned and precision == "tf32":
        peak = gpu.peak_flops("fp32")
    elif not aligned:
        eff *= gpu.unaligned_efficiency
    return max(flops / (peak * eff) + gpu.gemm_overhead_s, memory_seconds(moved_bytes, gpu))


def memory_seconds(moved_bytes: float, gpu: GpuType) -> float:
    """Seconds to read and write ``moved_bytes`` bytes at the achievable memory bandwidth."""
    return moved_bytes / (gpu.memory_bandwidth * gpu.memory_efficiency)


#: what bounds a kernel, in the order of a busy-seconds vector: tensor-core products, products on the SIMT cores
#: (fp32 without TF32, unaligned 16-bit or TF32), memory traffic (ampe.costmodel.kernel_energy prices each)
BOUNDS = ("tensor", "simt", "memory")


class _LayerRoofline(NamedTuple):
    """One layer's roofline seconds for one micro-batch on one tp rank, overheads excluded, and those seconds by
    what bounds each kernel (:data:`BOUNDS`), forward and backward."""

    forward: float
    backward: float
    attention: float  # of the forward: core attention (QKᵀ, softmax, ·V), what selective recomputation re-runs
    forward_busy: tuple[float, float, float]
    backward_busy: tuple[float, float, float]


class _Busy:
    """Seconds of a layer's kernels by bound (:data:`BOUNDS`), accumulated kernel by kernel."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]

    def gemm(self, flops: float, moved: float, gpu: GpuType, precision: str, aligned: bool, times: float = 1.0
             ) -> float:
        """Add ``times`` × one GEMM call (:func:`gemm_seconds`) to its bound; returns its seconds × ``times``. A
        compute-bound call's ``gemm_overhead_s`` is not busy (the fixed cost of a call: launch, partial waves)."""
        t = times * gemm_seconds(flops, moved, gpu, precision, aligned)
        if flops <= 0 or t <= times * memory_seconds(moved, gpu):
            self.seconds[2] += t
        else:
            tensor = gpu.tensor_cores(precision) and aligned
            self.seconds[0 if tensor else 1] += t - times * gpu.gemm_overhead_s
        return t

    def memory(self, moved: float, gpu: GpuType, passes: int = 0) -> float:
        """Add a memory-bound kernel moving ``moved`` bytes, and ``passes`` × ``pass_overhead_s`` of fixed cost (not
        busy); returns its seconds."""
        t = memory_seconds(moved, gpu)
        self.seconds[2] += t
        return t + passes * gpu.pass_overhead_s

    def tuple(self) -> tuple[float, float, float]:
        return (self.seconds[0], self.seconds[1], self.seconds[2])


def _attention_pair_bytes(gemms: list[Gemm], tp: int, mbs: int, b: int) -> float:
    """Bytes of the FlashAttention kernel fusing a layer's attention GEMMs: theirs less the scores, which the first
    writes and the second reads (Q, K, V read, the output written)."""
    total = sum(g.call_bytes(tp, mbs, b) for g in gemms)
    batch, m, n, _ = gemms[0].call(tp, mbs)
    return total - 2.0 * b * batch * m * n


def _kernel_roofline(layer: Layer, model: Model, gpu: GpuType, tp: int, mbs: int) -> _LayerRoofline:
    """A layer with kernels (:mod:`ampe.costmodel.kernels`): each at its own roofline, summed."""
    b, dtype = model.bytes_per_elem, model.gemm_precision
    tensor = gpu.tensor_cores(dtype)  # alignment matters only on tensor cores
    shards = tp if layer.tp_shardable else 1
    flash = model.attention == "flash"
    fwd = bwd = attn = 0.0
    f_busy, b_busy = _Busy(), _Busy()
    pair = [g for g in layer.gemms if g.attention]
    for g in layer.gemms:
        if g.attention and flash:
            continue
        flops, moved, aligned = g.call_flops(shards, mbs), g.call_bytes(shards, mbs, b), not tensor or g.aligned(
            shards, b)
        t = f_busy.gemm(flops, moved, gpu, dtype, aligned)
        fwd += t
        bwd += b_busy.gemm(flops, moved, gpu, dtype, aligned, 2.0) + b_busy.memory(2.0 * g.weight_bytes(shards, b),
                                                                                   gpu)
        attn += t if g.attention else 0.0
    if pair and flash:
        flops = sum(g.call_flops(shards, mbs) for g in pair)
        moved = _attention_pair_bytes(pair, shards, mbs, b)
        t = f_busy.gemm(flops, moved, gpu, dtype, True)
        fwd += t
        attn += t
        bwd += b_busy.gemm(2.5 * flops, 2.0 * moved, gpu, dtype, True)  # five GEMM-sized products: QKᵀ recomputed
    for e in layer.elementwise:
        if e.eager and flash:
            continue
        t = f_busy.memory(e.bytes(shards, mbs), gpu, 1)
        fwd += t
        bwd += b_busy.memory(e.bytes(shards, mbs, backward=True), gpu, 1)
        attn += t if e.eager else 0.0
    return _LayerRoofline(fwd, bwd, attn, f_busy.tuple(), b_busy.tuple())


def _flops_roofline(layer: Layer, model: Model, gpu: GpuType, tp: int, mbs: int) -> _LayerRoofline:
    """A layer known only by its FLOPs and activation bytes (a model YAML): one kernel whose FLOPs are the layer's
    and whose traffic is the activations it keeps plus its weights; backward twice that."""
    shards = tp if layer.tp_shardable else 1
    flops = mbs * layer.fwd_flops / shards
    moved = mbs * layer.act_bytes(tp) + layer.params_per_rank(tp) * model.bytes_per_elem
    busy = _Busy()
    t = busy.gemm(flops, moved, gpu, model.gemm_precision, True)
    bwd = 2.0 * t
    if model.attention == "flash" and layer.score_flops > 0:
        # FlashAttention's backward recomputes QKᵀ (half of core attention's forward FLOPs), at the layer's rate
        bwd += t * (layer.score_flops / 2) / layer.fwd_flops if layer.fwd_flops > 0 else 0.0
    share = layer.score_flops / layer.fwd_flops if layer.fwd_flops > 0 else 0.0
    fb = busy.tuple()
    k = bwd / t if t > 0 else 0.0  # the backward is this one kernel, longer
    return _LayerRoofline(t, bwd, t * share, fb, (fb[0] * k, fb[1] * k, fb[2] * k))


def _rooflines(model: Model, gpu: GpuType, tp: int, mbs: int) -> list[_LayerRoofline]:
    """Every layer's roofline; layers sharing their kernel lists (a zoo model's blocks) are computed once."""
    out: list[_LayerRoofline] = []
    seen: dict[tuple[int, int, bool], _LayerRoofline] = {}
    for layer in model.layers:
        if not (layer.gemms or layer.elementwise):
            out.append(_flops_roofline(layer, model, gpu, tp, mbs))
            continue
        key = (id(layer.gemms), id(layer.elementwise), layer.tp_shardable)
        hit = seen.get(key)
        if hit is None:
            hit = seen[key] = _kernel_roofline(layer, model, gpu, tp, mbs)
        out.append(hit)
    return out


def roofline_times(model: Model, gpu: GpuType, tp: int, mbs: int) -> tuple[np.ndarray, np.ndarray]:
    """Analytic (forward, backward) seconds per layer, tensor-parallel communication excluded."""
    fwd = np.empty(model.num_layers)
    bwd = np.empty(model.num_layers)
    for i, (layer, r) in enumerate(zip(model.layers, _rooflines(model, gpu, tp, mbs), strict=True)):
        fwd[i] = r.forward + gpu.layer_overhead_s
        bwd[i] = 0.0 if layer.frozen else r.backward + gpu.layer_overhead_s
    return fwd, bwd


def busy_seconds(model: Model, gpu: GpuType, tp: int, mbs: int) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) (L, 3) arrays: each layer's roofline seconds for one micro-batch on one tp rank by what
    bounds its kernels (:data:`BOUNDS`), overheads excluded; frozen layers do no backward."""
    rs = _rooflines(model, gpu, tp, mbs)
    trained = np.fromiter((not l.frozen for l in model.layers), dtype=float, count=model.num_layers)
    fwd = np.array([r.forward_busy for r in rs], dtype=float).reshape(model.num_layers, len(BOUNDS))
    bwd = np.array([r.backward_busy for r in rs], dtype=float).reshape(model.num_layers, len(BOUNDS))
    return fwd, bwd * trained[:, None]


def attention_share(model: Model, gpu: GpuType, tp: int, mbs: int) -> np.ndarray:
    """(L,) core attention's share of each layer's roofline forward (overhead included): what selective
    recomputation re-runs, as a fraction of the forward seconds (measured or analytic)."""
    out = np.zeros(model.num_layers)
    for i, r in enumerate(_rooflines(model, gpu, tp, mbs)):
        if r.attention > 0:
            out[i] = r.attention / (r.forward + gpu.layer_overhead_s)
    return out


def tp_allreduce_times(model: Model, tp: int, mbs: int, tp_bandwidth: float, latency_s: float) -> np.ndarray:
    """Seconds of Megatron tensor-parallel all-reduces per layer for *one* pass (forward or backward)."""
    out = np.zeros(model.num_layers)
    if tp < 2:
        return out
    b = model.bytes_per_elem
    for i, layer in enumerate(model.layers):
        if layer.tp_allreduces:
            one = ring_allreduce_time(mbs * layer.tp_allreduce_elems * b, tp, tp_bandwidth, latency_s)
            out[i] = layer.tp_allreduces * one
    return out


def _profiled(profile: Profile, model: Model, device: str, tp: int, mbs: int) -> tuple[np.ndarray, np.ndarray] | None:
    if not profile.covers(model.name, device, tp, model.num_layers):
        return None
    fwd = np.empty(model.num_layers)
    bwd = np.empty(model.num_layers)
    for i in range(model.num_layers):
        f, b = profile.layer_time(model.name, device, tp, i, mbs)  # type: ignore[misc]
        fwd[i], bwd[i] = f, b
    return fwd, bwd


def layer_times(
    model: Model,
    gpu: GpuType,
    tp: int,
    mbs: int,
    profile: Profile | None = None,
    tp_bandwidth: float = float("inf"),
    latency_s: float = 0.0,
    reference_gpus: dict[str, GpuType] | None = None,
) -> LayerTimes:
    """Per-layer (forward, backward) seconds for one micro-batch of ``mbs`` on one tp rank of ``gpu``.

    ``tp_bandwidth`` is the slowest hop (bytes/s) of the tensor-parallel ring; ``reference_gpus`` maps profiled
    device names to their GpuType for cross-type scaling (source 3 above). A straggler
    (:meth:`~ampe.costmodel.catalog.GpuType.slowed`) takes its healthy type's times × its ``slowdown``."""
    if gpu.straggler_of is not None:
        h = layer_times(model, gpu.healthy(), tp, mbs, profile, tp_bandwidth, latency_s, reference_gpus)
        return LayerTimes(h.forward_s * gpu.slowdown, h.backward_s * gpu.slowdown,
                          f"{h.source} ×{gpu.slowdown:g} (straggler)")
    if profile is not None and model.tf32 and model.gemm_precision == "tf32" and gpu.peak_flops_tf32 is not None:
        return _tf32_from_profile(model, gpu, tp, mbs, profile, tp_bandwidth, latency_s, reference_gpus)
    comm = tp_allreduce_times(model, tp, mbs, tp_bandwidth, latency_s)
    if profile is not None:
        profile = profile.for_model(model)  # the rows of the model's attention kernel only
        exact = _profiled(profile, model, gpu.name, tp, mbs)
        if exact is not None:
            return _frozen_aware(model, exact[0], exact[1], "profile")
        roof_f, roof_b = roofline_times(model, gpu, tp, mbs)
        if tp > 1:
            base = _profiled(profile, model, gpu.name, 1, mbs)
            if base is not None:
                r1f, r1b = roofline_times(model, gpu, 1, mbs)
                f = base[0] * _ratio(roof_f, r1f) + comm
                b = base[1] * _ratio(roof_b, r1b) + comm
                return _frozen_aware(model, f, b, "profile-tp1+roofline")
        for ref_name in sorted(profile.devices(model.name)):
            ref = (reference_gpus or {}).get(ref_name) or CATALOG.get(ref_name)
            if ref is None:
                continue
            for ref_tp in (tp, 1):
                base = _profiled(profile, model, ref_name, ref_tp, mbs)
                if base is None:
                    continue
                rf, rb = roofline_times(model, ref, ref_tp, mbs)
                extra = comm if ref_tp != tp else 0.0  # measured at this tp: its communication is inside
                f = base[0] * _ratio(roof_f, rf) + extra
                b = base[1] * _ratio(roof_b, rb) + extra
                return _frozen_aware(model, f, b, f"profile({ref_name})+roofline")
    f, b = roofline_times(model, gpu, tp, mbs)
    return _frozen_aware(model, f + comm, b + comm, "roofline")


def _tf32_from_profile(model: Model, gpu: GpuType, tp: int, mbs: int, profile: Profile, tp_bandwidth: float,
                       latency_s: float, reference_gpus: dict[str, GpuType] | None) -> LayerTimes:
    """Layer times of an fp32 model with TF32 allowed, from a profile: ``ampe profile`` times fp32 with TF32 off
    (PyTorch's default, which the profiler sets), so a profiled layer is scaled by its roofline with TF32 over its
    roofline without (its tensor-parallel all-reduces, inside a tp > 1 figure, are scaled with it)."""
    plain = model.with_tf32(False)
    base = layer_times(plain, gpu, tp, mbs, profile, tp_bandwidth, latency_s, reference_gpus)
    if base.source == "roofline":
        return layer_times(model, gpu, tp, mbs, None, tp_bandwidth, latency_s)
    tf_f, tf_b = roofline_times(model, gpu, tp, mbs)
    fp_f, fp_b = roofline_times(plain, gpu, tp, mbs)
    return LayerTimes(base.forward_s * _ratio(tf_f, fp_f), base.backward_s * _ratio(tf_b, fp_b),
                      f"{base.source}+roofline(tf32)")


def recompute_extra_s(model: Model, forward_s: np.ndarray, recompute: str,
                      share: np.ndarray | None = None) -> np.ndarray:
    """(L,) seconds each layer's backward gains from activation recomputation, from its forward seconds:
    ``full`` re-runs a checkpointed block's whole forward (its tensor-parallel all-reduces included);
    ``selective`` re-runs core attention (QKᵀ, softmax, ·V; with FlashAttention its kernel, which saves nothing
    then) of a block: the forward times ``share``, core attention's share of the roofline forward
    (:func:`attention_share`: on a GPU eager attention's s² passes are memory-bound and weigh more than their FLOPs),
    or without it score_flops / fwd_flops (2.7 % for GPT-3 175B, as Korthikanti et al. report). Frozen layers have
    no backward."""
    out = np.zeros(model.num_layers)
    if recompute == "none":
        return out
    for i, l in enumerate(model.layers):
        if l.frozen or not l.checkpointed:
            continue
        if recompute == "full":
            out[i] = forward_s[i]
        elif l.score_flops > 0 and l.fwd_flops > 0:  # eager scores, or FlashAttention's kernel run again
            out[i] = forward_s[i] * (share[i] if share is not None else l.score_flops / l.fwd_flops)
    return out


def recompute_layer_times(model: Model, base: LayerTimes, recompute: str, profile: Profile | None, device: str,
                          tp: int, mbs: int, share: np.ndarray | None = None) -> LayerTimes:
    """Per-layer seconds under ``recompute`` from the times without it (``base``): a layer the profile measured under
    ``recompute`` on ``device`` at ``tp`` takes that row's forward and backward (the backward re-runs what the
    recomputation re-runs) where ``base`` is that measured profile itself (source ``profile``); every other layer
    adds :func:`recompute_extra_s` (with ``share``, core attention's share of the forward) to its backward."""
    fwd, bwd = base.forward_s.copy(), base.backward_s + recompute_extra_s(model, base.forward_s, recompute, share)
    if recompute != "none" and profile is not None and base.source == "profile":
        view = profile.for_model(model)
        for i in range(model.num_layers):
            got = view.recompute_sample(model.name, device, tp, i, mbs, recompute)
            if got is not None:
                fwd[i], bwd[i] = got.forward_s, got.backward_s
    return _frozen_aware(model, fwd, bwd, base.source)


def _frozen_aware(model: Model, fwd: np.ndarray, bwd: np.ndarray, source: str) -> LayerTimes:
    """Frozen layers have no backward pass at all (FreezePipe)."""
    frozen = np.fromiter((l.frozen for l in model.layers), dtype=bool, count=model.num_layers)
    return LayerTimes(fwd, np.where(frozen, 0.0, bwd), source)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """Element-wise num/den with 0/0 → 1 (a layer with no work scales as nothing)."""
    out = np.ones_like(num)
    np.divide(num, den, out=out, where=den > 0)
    return out
