"""Per-device memory of a pipeline stage, and whether it fits.

For one tensor-parallel rank of stage j holding layers ``a..b-1`` (all figures in bytes)::

    states       = Σ params_l/tp · 16            mixed-precision Adam: fp16/bf16 weight 2 + grad 2 + fp32 master 4
                                                  + Adam m 4 + v 4 (fp32 training: weight 4 + grad 4 + m 4 + v 4);
                                                  frozen layers keep only the weight (2 or 4)
    activations  = Σ act_l(tp) · mbs · in_flight(j)   what each layer keeps for backward, times the micro-batches
                                                  the schedule keeps in flight on stage j (1F1B: min(pp−j, gas);
                                                  GPipe: gas); a profile's measured ``memory_bytes`` replaces act_l
    pipe buffers = in_flight(j) · mbs · out_elems(a−1) · bytes   received activations (stages j > 0)
    logits       = mbs · out_elems · (bytes + 8)  for a `logits` layer: the logits plus fp32 softmax and its
                                                  gradient in the loss (transient, one micro-batch)
    reserved     = GpuType.reserved_bytes         CUDA context, allocator fragmentation, workspaces

Tied layers are held (weights, grads, optimizer states) by every stage that has one, as DeepSpeed does; on one stage
the tied weight is a single tensor and counts once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ampe.costmodel.catalog import GpuType
from ampe.costmodel.model import Model

GiB = float(1 << 30)


def state_bytes_per_param(dtype: str, frozen: bool = False) -> int:
    """Bytes of weights + gradients + Adam states per parameter (mixed precision for fp16/bf16)."""
    if dtype == "fp32":
        return 4 if frozen else 16
    return 2 if frozen else 16


def in_flight(schedule: str, stage: int, pp: int, gas: int, virtual_stages: int = 1) -> int:
    """Micro-batches whose activations a stage keeps at the peak of the schedule.

    1F1B: stage j runs pp−j warm-up forwards before its first backward → min(pp−j, gas). GPipe: all gas.
    Interleaved 1F1B (Megatron): each device warms up (pp−j−1)·2 + (v−1)·pp + 1 chunk-forwards; measured in
    *chunk* micro-batches, i.e. each holding 1/v of the device's layers."""
    if schedule == "gpipe":
        return gas
    if schedule == "interleaved" and virtual_stages > 1:
        total = gas * virtual_stages
        return min((pp - stage - 1) * 2 + (virtual_stages - 1) * pp + 1, total)
    return min(pp - stage, gas)


def layer_state_bytes(model: Model, tp: int) -> np.ndarray:
    """(L,) bytes of weights+grads+optimizer states per layer on one tp rank."""
    return np.array([l.params_per_rank(tp) * state_bytes_per_param(model.dtype, l.frozen) for l in model.layers])


def layer_activation_bytes(model: Model, tp: int, mbs: int, measured: np.ndarray | None = None) -> np.ndarray:
    """(L,) activation bytes kept for backward per micro-batch (0 for frozen layers: no autograd graph)."""
    act = np.array([0.0 if l.frozen else l.act_bytes(tp) * mbs for l in model.layers])
    if measured is not None:
        act = np.where(np.isnan(measured), act, measured)
        act[[i for i, l in enumerate(model.layers) if l.frozen]] = 0.0
    return act


def layer_memory_table(model: Model, stage: int, pp: int, tp: int, mbs: int, gas: int, schedule: str = "1f1b",
                       layer_states: np.ndarray | None = None, layer_acts: np.ndarray | None = None) -> np.ndarray:
    """(L,) bytes each layer would add on ``stage`` (states + activations × in-flight + transient buffers).

    Additive over a stage's layers, so a layer-assignment DP can use prefix sums. It counts a tied weight on every
    layer holding it (conservative when both ends share a stage) and leaves out the pipe receive buffers and
    ``reserved_bytes``, which depend on the cut or not at all; :func:`stage_memory` is exact."""
    states = layer_state_bytes(model, tp) if layer_states is None else layer_states
    acts = layer_activation_bytes(model, tp, mbs) if layer_acts is None else layer_acts
    return states + acts * in_flight(schedule, stage, pp, gas) + layer_transient_bytes(model, mbs)


def layer_transient_bytes(model: Model, mbs: int) -> np.ndarray:
    """(L,) one-micro-batch buffers (the loss's logits, fp32 softmax and gradient) charged to the layer holding them."""
    b = model.bytes_per_elem
    return np.array([mbs * l.out_elems * (b + 8) if l.kind == "logits" else 0.0 for l in model.layers])


@dataclass(frozen=True)
class StageMemory:
    """Memory of one tp rank of one stage, by component (bytes)."""

    states: float
    activations: float
    buffers: float
    transient: float
    reserved: float
    in_flight: int

    @property
    def total(self) -> float:
        """Sum of every component, bytes."""
        return self.states + self.activations + self.buffers + self.transient + self.reserved

    def explain(self, gpu: GpuType) -> str:
        """A one-line breakdown for OOM messages."""
        return (f"needs {self.total / GiB:.2f} GiB of {gpu.name}'s {gpu.memory_bytes / GiB:.2f} GiB: "
                f"weights+grads+optimizer {self.states / GiB:.2f}, activations {self.activations / GiB:.2f} "
                f"({self.in_flight} micro-batches in flight), buffers {(self.buffers + self.transient) / GiB:.2f}, "
                f"reserved {self.reserved / GiB:.2f}")


def stage_memory(
    model: Model,
    layers: range,
    stage: int,
    pp: int,
    tp: int,
    mbs: int,
    gas: int,
    gpu: GpuType,
    schedule: str = "1f1b",
    virtual_stages: int = 1,
    measured_activation: np.ndarray | None = None,
    layer_states: np.ndarray | None = None,
    layer_acts: np.ndarray | None = None,
) -> StageMemory:
    """Memory of one tp rank of ``stage`` holding ``layers`` on a device of type ``gpu``.

    ``layer_states``/``layer_acts`` may be passed precomputed (search hot path)."""
    states = layer_state_bytes(model, tp) if layer_states is None else layer_states
    acts = layer_activation_bytes(model, tp, mbs, measured_activation) if layer_acts is None else layer_acts
    k = in_flight(schedule, stage, pp, gas, virtual_stages)
    sl = slice(layers.start, layers.stop)
    act = float(acts[sl].sum()) * k
    if schedule == "interleaved" and virtual_stages > 1:
        act /= virtual_stages  # counted in chunk micro-batches; `layers` is all the device's layers
    dup = sum(n / (tp if model.layers[i].tp_shardable else 1) * state_bytes_per_param(model.dtype,
                                                                                     model.layers[i].frozen)
              for i, n in model.tied_duplicates(layers))
    first = layers.start
    buffers = k * mbs * model.layers[first - 1].out_elems * model.bytes_per_elem if first > 0 else 0.0
    transient = float(layer_transient_bytes(model, mbs)[sl].sum())
    return StageMemory(float(states[sl].sum()) - dup, act, float(buffers), transient, float(gpu.reserved_bytes), k)
