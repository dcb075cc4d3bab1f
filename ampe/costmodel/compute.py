"""Per-layer forward/backward time on one GPU type, for one micro-batch on one tensor-parallel rank.

Sources, in order of preference (the first that covers *every* layer of the model wins):

1. ``profile`` measured on this GPU type at this tp — used as is (tp communication was measured with it);
2. ``profile`` on this GPU type at tp = 1 — scaled by the roofline ratio roofline(tp)/roofline(1), plus the
   analytic tensor-parallel all-reduces;
3. ``profile`` of the same model on another GPU type — scaled per layer by roofline(this type)/roofline(that type)
   (the profiled type with most layers covered is the reference), plus analytic all-reduces when tp > 1;
4. the analytic roofline alone.

Roofline (documented in docs/cost_model.md)::

    work      = mbs · seq / tp                                   tokens of work per shard
    eff       = matmul_efficiency · work / (work + tokens_half)   achieved fraction of peak FLOP/s
    t_flops   = mbs · fwd_flops / tp / (peak · eff)
    t_memory  = (mbs · act_bytes(tp) + params/tp · bytes) / (memory_bandwidth · memory_efficiency)
    forward   = t_flops + t_memory + layer_overhead_s
    backward  = 2 · (t_flops + t_memory) + layer_overhead_s      (0 for frozen layers)
                (+ QKᵀ again with FlashAttention: its backward recomputes the scores)

Activation recomputation adds to the backward (:func:`recompute_extra_s`, applied by the cost model), or, where the
profile measured the layer under that recomputation on this GPU type at this tp, the measured row replaces the layer's
times (:func:`recompute_layer_times`). A profile is read for the model's attention kernel
(:meth:`ampe.costmodel.profile.Profile.for_model`).

Tensor parallelism (Megatron): each transformer block does 2 all-reduces of ``mbs·s·h`` elements in forward and 2 in
backward over the tp group's ring.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ampe.costmodel.catalog import CATALOG, GpuType
from ampe.costmodel.comm import ring_allreduce_time
from ampe.costmodel.model import Model
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


def roofline_times(model: Model, gpu: GpuType, tp: int, mbs: int) -> tuple[np.ndarray, np.ndarray]:
    """Analytic (forward, backward) seconds per layer, tensor-parallel communication excluded."""
    b = model.bytes_per_elem
    peak = gpu.peak_flops(model.dtype)
    seq = max(model.seq_len, 1)
    fwd = np.empty(model.num_layers)
    bwd = np.empty(model.num_layers)
    for i, layer in enumerate(model.layers):
        shards = tp if layer.tp_shardable else 1
        work = mbs * seq / shards
        eff = gpu.matmul_efficiency * work / (work + gpu.tokens_half)
        t_flops = mbs * layer.fwd_flops / shards / (peak * eff) if layer.fwd_flops > 0 else 0.0
        moved = mbs * layer.act_bytes(tp) + layer.params_per_rank(tp) * b
        t_mem = moved / (gpu.memory_bandwidth * gpu.memory_efficiency)
        fwd[i] = t_flops + t_mem + gpu.layer_overhead_s
        bwd[i] = 0.0 if layer.frozen else 2.0 * (t_flops + t_mem) + gpu.layer_overhead_s
        if model.attention == "flash" and layer.score_flops > 0 and not layer.frozen:
            # FlashAttention's backward recomputes QKᵀ (half of core attention's forward FLOPs)
            bwd[i] += mbs * layer.score_flops / 2 / shards / (peak * eff)
    return fwd, bwd


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
    device names to their GpuType for cross-type scaling (source 3 above)."""
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


def recompute_extra_s(model: Model, forward_s: np.ndarray, recompute: str) -> np.ndarray:
    """(L,) seconds each layer's backward gains from activation recomputation, from its forward seconds:
    ``full`` re-runs a checkpointed block's whole forward (its tensor-parallel all-reduces included);
    ``selective`` re-runs core attention (QKᵀ, softmax, ·V; with FlashAttention its kernel, which saves nothing
    then) of a block: the forward scaled by score_flops / fwd_flops (2.7 % for GPT-3 175B, as Korthikanti et al.
    report). Frozen layers have no backward."""
    out = np.zeros(model.num_layers)
    if recompute == "none":
        return out
    for i, l in enumerate(model.layers):
        if l.frozen or not l.checkpointed:
            continue
        if recompute == "full":
            out[i] = forward_s[i]
        elif l.score_flops > 0 and l.fwd_flops > 0:  # eager scores, or FlashAttention's kernel run again
            out[i] = forward_s[i] * l.score_flops / l.fwd_flops
    return out


def recompute_layer_times(model: Model, base: LayerTimes, recompute: str, profile: Profile | None, device: str,
                          tp: int, mbs: int) -> LayerTimes:
    """Per-layer seconds under ``recompute`` from the times without it (``base``): a layer the profile measured under
    ``recompute`` on ``device`` at ``tp`` takes that row's forward and backward (the backward re-runs what the
    recomputation re-runs) where ``base`` is that measured profile itself (source ``profile``); every other layer
    adds :func:`recompute_extra_s` to its backward."""
    fwd, bwd = base.forward_s.copy(), base.backward_s + recompute_extra_s(model, base.forward_s, recompute)
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
