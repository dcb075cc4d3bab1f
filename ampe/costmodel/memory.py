"""Per-device memory of a pipeline stage, and whether it fits.

For one tensor-parallel rank of stage j holding layers ``a..b-1`` (all figures in bytes)::

    states       = Σ params_l/tp · bytes/param   what DeepSpeed's optimizer for the precision keeps (the runtime's one
                   + Σ buffers_l                 config, ampe.costmodel.training; :func:`state_bytes_per_param`):
                                                  fp32: torch's AdamW itself, weight 4 + grad 4 + m 4 + v 4 = 16;
                                                  fp16: FP16_UnfusedOptimizer, weight 2 + grad 2 + fp32 master 4 + m 4
                                                  + v 4 = 16; bf16: BF16_Optimizer, weight 2 + grad 2 + its gradient
                                                  accumulation buffer 2 (bf16: the config sets no fp32 accumulation)
                                                  + (fp32 master 4 + m 4 + v 4)/dp (it partitions them over the dp
                                                  group) = 18 at dp 1; frozen layers keep only the weight (2 or 4);
                                                  module buffers (rotary tables, causal masks) per layer
    activations  = Σ act_l(tp) · mbs · k_j        what each layer keeps for backward, times the micro-batches the
                                                  schedule keeps in flight on stage j (k_j; 1F1B: min(pp−j, gas);
                                                  GPipe: gas); a profile's measured ``memory_bytes`` replaces act_l;
                                                  dropout masks take the device's ``mask_bytes``
    pipe buffers = DeepSpeed's pipeline engine keeps n_j = max(2, min(pp−j, gas)) buffer slots per stage: each holds
                   a micro-batch's received input (a clone; the layer's own saved input is already counted in the
                   activations, so only max(n_j − k_j, 0) + 1 extra copies, the +1 being the receive buffer; the
                   clamp matters where k_j > n_j: GPipe, interleaved) and its output (not saved by autograd, so all
                   n_j count), plus one receive buffer for the output gradient (stages before the last)
    final output = the last stage keeps its logits in min(n_j, gas) slots (DeepSpeed never frees them there);
                   at tp > 1 each rank's are its 1/tp slice of the vocabulary (the loss is vocab-parallel)
    loss         = mbs · out_elems · 12           on the last stage at tp = 1: the loss's fp32 log-softmax (saved),
                                                  the NLL input gradient and the log-softmax input gradient, alive
                                                  together at the start of the loss backward (transient, one
                                                  micro-batch of mbs·s·V logits; at 16-bit the forward's fp32
                                                  upcast is smaller and gone by then); at tp > 1 the vocab-parallel
                                                  loss's one fp32 copy of the rank's mbs·s·V/tp logits (+ the
                                                  gradient's cast at 16-bit): 4 (6) bytes per local logit
                                                  (:func:`loss_bytes`)
    gradients    = part of ``states``, except when every micro-batch is in flight at once (k_j ≥ gas: gas = 1, or
                   GPipe): the first backward starts before any gradient exists, so the peak is the larger of
                   k_j micro-batches' activations without gradients and k_j − 1 with them (each with one layer's
                   backward working set, below; with k_j = 1 nothing runs once the gradients exist)
    all-reduce   = dp > 1 without ZeRO at fp32/fp16: DeepSpeed flattens the stage's gradients into one buffer to
                   all-reduce them (a copy, after the last backward: with the states and the kept logits), where that
                   exceeds the training peak (counted in ``optimizer_step``)
    optimizer    = the optimizer step's peak (every state with its gradient — torch's fused AdamW keeps no
                   temporaries — plus the last stage's kept logits, plus the fp32 gradient copies of fp16's and
                   bf16's optimizers and ZeRO-1's buckets: :func:`optimizer_step_extra`) where it exceeds the
                   training peak — for stages with few activations
    backward     = one micro-batch of one layer's backward working set on top of the kept activations (its widest
                   gradients; with eager attention the scores' gradient; under selective recomputation the re-created
                   softmax output; under full recomputation the block's re-run forward too): the ``recompute``
                   component; on the last stage only what exceeds the loss's working set, which is freed by then
    workspace    = GpuType.workspace_bytes        library workspaces (cuBLAS) torch allocates through its allocator

The sum above is the allocated peak (what ``torch.cuda.max_memory_allocated`` measures: ``StageMemory.allocated``).
The device holds more (``StageMemory.total``, the footprint)::

    fragmentation = allocated · GpuType.fragmentation        reserved but unallocated (the caching allocator's
                                                              split blocks; ``fragmentation_expandable`` with
                                                              ``expandable_segments``)
    context       = GpuType.context_bytes                    outside PyTorch: CUDA context, libraries' kernels

A device *fits* a strategy when footprint + reserve ≤ capacity (reserve = ``GpuType.memory_reserve`` × capacity);
it is *at risk* when only footprint ≤ capacity holds (:func:`memory_risk`), and out of memory beyond that.

Memory-saving options (per strategy; docs/cost_model.md):

* recompute ``selective``: act_l drops attention's s² part (Korthikanti et al. 2022: 34·s·h bytes per sample and
  block at tp = 1, instead of s·h·(34 + 5·a·s/h)); ``full``: a checkpointed block keeps only its input (2·s·h at
  16-bit), and the backward of one block re-runs its forward, so one micro-batch of one block's full activations
  (the largest block of the stage) is alive on top (``recompute`` component; on the last stage only what exceeds
  the loss's working set, which is freed by then).
* ZeRO stage 1 over the dp group (DeepSpeedZeroOptimizer, for every precision): the optimizer states (fp32 master
  4 + m 4 + v 4 bytes per parameter) are split over dp ranks: states = params · (2 + 2 + 12/dp) at 16-bit. At fp32
  DeepSpeed's ZeRO optimizer still keeps an fp32 copy of its partition: params · (4 + 4 + 12/dp).
* FlashAttention is a property of the model (:meth:`ampe.costmodel.model.Model.with_attention`): its layers carry
  no s² score memory at all.

Tied layers are held (weights, grads, optimizer states) by every stage that has one, as DeepSpeed does; on one stage
the tied weight is a single tensor and counts once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ampe.costmodel.catalog import GpuType
from ampe.costmodel.cluster import Cluster
from ampe.costmodel.final_output import final_output_bytes, loss_bytes
from ampe.costmodel.layout import DeviceLayout
from ampe.costmodel.model import Model

GiB = float(1 << 30)


RECOMPUTE = ("none", "selective", "full")
# ZeRO-1's gradient reduction buckets: the plan's and the trial worker's DeepSpeed `reduce_bucket_size` (elements);
# DeepSpeed allocates ZERO_BUCKETS of them, full size, when it reduces the gradients (measured on CPU trials)
ZERO_BUCKET_ELEMS = 50_000_000
ZERO_BUCKETS = 2


def state_bytes_per_param(dtype: str, frozen: bool = False, zero: int = 0, dp: int = 1) -> float:
    """Bytes per parameter that DeepSpeed 0.19's optimizer for ``dtype`` keeps through training (the one config,
    :func:`ampe.costmodel.training.deepspeed_config`; the engine picks the wrapper in ``_do_optimizer_sanity_check``):

    * ZeRO stage 1 (``zero`` = 1, DeepSpeedZeroOptimizer): weight + gradient in the training precision and the 12
      bytes of fp32 master + Adam m + v split over the ``dp`` ranks (at fp32 its own fp32 copy of the partition
      too: 4 + 4 + 12/dp);
    * fp32: torch's AdamW on the parameters themselves, 4 + 4 + 4 + 4;
    * fp16: FP16_UnfusedOptimizer (torch's AdamW is not DeepSpeed's FusedAdam): 2 + 2 + an fp32 master 4 + 4 + 4,
      not partitioned;
    * bf16: BF16_Optimizer (the pipeline engine's choice at bf16 without ZeRO): 2 + 2 + its flat gradient
      accumulation buffer, 2 (bf16: the config sets no fp32 ``data_types.grad_accum_dtype``), + fp32 master + m + v
      partitioned over the dp group like ZeRO-1's, 12/dp. DeepSpeed's log on the H200 record: 2.33 GiB allocated
      before its init and 9.24 after for 1.24 B parameters (+6 bytes each: master and accumulation buffer).

    A frozen layer keeps only its weight (2 or 4)."""
    if frozen:
        return 4 if dtype == "fp32" else 2
    if zero:
        return 8.0 + 12.0 / dp if dtype == "fp32" else 4.0 + 12.0 / dp
    if dtype == "bf16":
        return 6.0 + 12.0 / dp
    return 16


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


def layer_state_bytes(model: Model, tp: int, zero: int = 0, dp: int = 1) -> np.ndarray:
    """(L,) bytes of weights+grads+optimizer states per layer on one tp rank (a frozen layer keeps only its weights,
    except a tied weight that still trains through another layer of its group), plus its module buffers
    (``Layer.buffer_bytes``); the optimizer's bytes per parameter as :func:`state_bytes_per_param`."""
    trained_b = state_bytes_per_param(model.dtype, zero=zero, dp=dp)
    frozen_b = state_bytes_per_param(model.dtype, frozen=True)
    out = []
    for l in model.layers:
        trained = l.trainable_params_per_rank(tp)
        out.append(trained * trained_b + (l.params_per_rank(tp) - trained) * frozen_b + l.buffer_bytes)
    return np.array(out)


def layer_activation_bytes(model: Model, tp: int, mbs: int, measured: np.ndarray | None = None,
                           mask_bytes: int = 1, recompute: str = "none",
                           measured_recompute: np.ndarray | None = None) -> np.ndarray:
    """(L,) activation bytes kept for backward per micro-batch (0 for frozen layers: no autograd graph). Per layer,
    the first of: ``measured_recompute`` (bytes a profile measured under ``recompute``; NaN: not measured), the
    profile's ``measured`` bytes without recomputation scaled by the analytic ratio recompute/none, the analytic
    figure."""
    act = np.array([0.0 if l.frozen else l.act_bytes(tp, mask_bytes, recompute) * mbs for l in model.layers])
    if measured is not None:
        if recompute != "none":
            plain = np.array([l.act_bytes(tp, mask_bytes) * mbs for l in model.layers])
            measured = measured * np.divide(act, plain, out=np.ones_like(act), where=plain > 0)
        act = np.where(np.isnan(measured), act, measured)
    if measured_recompute is not None and recompute != "none":
        act = np.where(np.isnan(measured_recompute), act, measured_recompute)
    if measured is not None or measured_recompute is not None:
        act[[i for i, l in enumerate(model.layers) if l.frozen]] = 0.0
    return act


def recompute_working_bytes(model: Model, layers: range, tp: int, mbs: int, mask_bytes: int = 1,
                            recompute: str = "none") -> float:
    """Bytes alive on top of the kept activations while one layer's backward runs, for one micro-batch (the stage's
    largest such layer): its gradient working set (:func:`backward_working_bytes`), and with ``full`` recomputation
    the forward it re-runs first (that block's activations without recomputation)."""
    worst = 0.0
    for i in layers:
        l = model.layers[i]
        if l.frozen:
            continue
        work = backward_working_bytes(l, tp, mask_bytes, recompute)
        if recompute == "full" and l.checkpointed:
            work += l.act_bytes(tp, mask_bytes)
        worst = max(worst, work * mbs)
    return worst


def backward_working_bytes(layer: Any, tp: int, mask_bytes: int = 1, recompute: str = "none") -> float:
    """Bytes per sample a layer's backward holds on top of what it keeps: its widest gradients, plus with eager
    attention the gradient of the scores, and under selective recomputation the re-created s² part of what it
    would keep (softmax and dropout outputs, the dropout mask at ``mask_bytes`` per element) too."""
    work = (layer.bwd_work_bytes_sharded + layer.score_grad_bytes_sharded) / tp
    if recompute == "selective":
        work += (layer.score_bytes_sharded + mask_bytes * layer.score_mask_elems_sharded) / tp
    return work


def pipe_buffer_slots(stage: int, pp: int, gas: int) -> int:
    """DeepSpeed ``TrainSchedule.num_pipe_buffers``: max(2, min(pp − stage, gas))."""
    return max(2, min(pp - stage, gas))


def output_slots(stage: int, pp: int, gas: int) -> int:
    """Pipe buffer slots that hold a final output on the last stage: DeepSpeed never frees the last stage's outputs,
    so every slot used in an iteration keeps its micro-batch's logits — min(slots, gas)."""
    return min(pipe_buffer_slots(stage, pp, gas), gas)


def grad_bytes_per_param(dtype: str) -> int:
    """Bytes of the gradient DeepSpeed accumulates per trainable parameter (the training precision)."""
    return 4 if dtype == "fp32" else 2


def input_copies(slots: int, k: int) -> int:
    """Received-input copies a stage with ``slots`` pipe buffers and ``k`` micro-batches in flight keeps beyond the
    inputs its layers save: the slots not shared with a saved input, plus the receive buffer. Never below the
    receive buffer alone: where more micro-batches are in flight than there are slots (GPipe, interleaved 1F1B) every
    slot holds a saved input (``slots - k + 1`` went negative there and made the stage's total memory negative)."""
    return max(slots - k, 0) + 1


def boundary_buffer_bytes(model: Model, first: int, last: int, stage: int, pp: int, mbs: int, gas: int,
                          k: int) -> float:
    """Pipe buffers a stage holding layers ``first..last`` keeps for its boundaries (bytes; see module docstring):
    :func:`input_buffer_bytes` + :func:`output_buffer_bytes`. The final output, when ``last`` is the model's last
    layer, is in :func:`final_output_bytes` instead."""
    slots = pipe_buffer_slots(stage, pp, gas)
    return input_buffer_bytes(model, first, mbs, slots, k) + output_buffer_bytes(model, last, mbs, slots)


def input_buffer_bytes(model: Model, first: int, mbs: int, slots: int, k: int) -> float:
    """Pipe buffers a stage whose first layer is ``first`` keeps for the cut before it, bytes: the received inputs
    not shared with a saved one and the receive buffer (:func:`input_copies`); the token ids on the first stage.
    ``slots``: :func:`pipe_buffer_slots`; ``k``: micro-batches in flight."""
    if first > 0:
        return input_copies(slots, k) * mbs * model.layers[first - 1].out_elems * model.bytes_per_elem
    return slots * mbs * max(model.seq_len, 1) * 8  # token ids (int64)


def output_buffer_bytes(model: Model, last: int, mbs: int, slots: int) -> float:
    """Pipe buffers a stage whose last layer is ``last`` keeps for the cut after it, bytes: its outputs and the
    output-gradient receive buffer (none across a frozen cut: no gradient comes back); 0 on the last stage."""
    if last >= model.num_layers - 1:
        return 0.0
    grad_buffer = 0 if all(l.frozen for l in model.layers[: last + 1]) else 1
    return (slots + grad_buffer) * mbs * model.layers[last].out_elems * model.bytes_per_elem


@dataclass(frozen=True)
class StageMemory:
    """Memory of one tp rank of one stage, by component (bytes): the tensors and workspaces of the allocated peak,
    and what the device holds beyond it (the allocator's fragmentation, the context outside PyTorch)."""

    states: float
    activations: float
    buffers: float  # pipe buffers at the stage's boundaries
    transient: float  # the model's final output in every buffer slot + the loss's working set (last stage)
    in_flight: int
    optimizer_step: float = 0.0  # how much the optimizer step's peak exceeds the training peak
    recompute: float = 0.0  # full recomputation: one block's activations re-created inside its backward
    workspace: float = 0.0  # library workspaces in the allocator (GpuType.workspace_bytes)
    fragmentation_share: float = 0.0  # reserved-but-unallocated bytes per allocated byte (allocator_fragmentation)
    context: float = 0.0  # outside PyTorch: CUDA context, libraries (GpuType.context_bytes)

    @property
    def allocated(self) -> float:
        """The allocated peak, bytes: what ``torch.cuda.max_memory_allocated`` (CPU: the worker's tensor trace)
        measures."""
        return (self.states + self.activations + self.buffers + self.transient + self.optimizer_step
                + self.recompute + self.workspace)

    @property
    def fragmentation(self) -> float:
        """Bytes the caching allocator holds reserved but unallocated at the peak."""
        return self.fragmentation_share * self.allocated

    @property
    def reserved(self) -> float:
        """What the allocated peak does not show, bytes: fragmentation + context (``total - reserved`` is
        :attr:`allocated`)."""
        return self.fragmentation + self.context

    @property
    def total(self) -> float:
        """The footprint on the device, bytes: allocated + fragmentation + context."""
        return self.allocated + self.reserved

    def to_dict(self) -> dict[str, float | int]:
        """The breakdown in bytes (plan files, ``ampe evaluate --json``)."""
        return {"states": self.states, "activations": self.activations, "buffers": self.buffers + self.transient,
                "recompute": self.recompute, "optimizer_step": self.optimizer_step, "workspace": self.workspace,
                "allocated": self.allocated, "fragmentation": self.fragmentation, "context": self.context,
                "in_flight": self.in_flight, "total": self.total}

    def explain(self, gpu: GpuType) -> str:
        """A one-line breakdown for OOM messages."""
        return (f"needs {self.total / GiB:.2f} GiB of {gpu.name}'s {gpu.memory_bytes / GiB:.2f} GiB: "
                f"weights+grads+optimizer {self.states / GiB:.2f}, activations {self.activations / GiB:.2f} "
                f"({self.in_flight} micro-batches in flight), buffers {(self.buffers + self.transient) / GiB:.2f}, "
                + (f"optimizer step {self.optimizer_step / GiB:.2f}, " if self.optimizer_step else "")
                + (f"recompute {self.recompute / GiB:.2f}, " if self.recompute else "")
                + f"workspaces {self.workspace / GiB:.2f}, allocator fragmentation {self.fragmentation / GiB:.2f}, "
                f"context {self.context / GiB:.2f}")


def allocator_fragmentation(gpu: GpuType, expandable: bool | None) -> float:
    """Reserved-but-unallocated bytes per allocated byte on ``gpu``: ``fragmentation_expandable`` with
    ``expandable_segments`` on, else ``fragmentation`` (None: not set by the plan, PyTorch's default, off)."""
    return gpu.fragmentation_expandable if expandable else gpu.fragmentation


def allocatable_bytes(gpu: GpuType, expandable: bool | None, margin: bool = False) -> float:
    """The largest allocated peak (workspaces included) whose footprint is within ``gpu``'s capacity: (capacity −
    context) / (1 + fragmentation), bytes; with ``margin``, whose footprint also leaves the reserve free
    (:func:`reserve_bytes`: the strategy *fits*). What the layer-assignment DP bounds each stage by
    (:mod:`ampe.costmodel.dp_memory`)."""
    free = gpu.memory_bytes - gpu.context_bytes - (reserve_bytes(gpu) if margin else 0.0)
    return free / (1.0 + allocator_fragmentation(gpu, expandable))


def reserve_bytes(gpu: GpuType) -> float:
    """The margin a strategy must leave free on ``gpu`` to fit without risk: ``memory_reserve`` × capacity, bytes."""
    return gpu.memory_reserve * gpu.memory_bytes


def memory_risk(mem: StageMemory, gpu: GpuType) -> str | None:
    """Why a device whose footprint fits ``gpu`` is at risk (its footprint within the reserve of the capacity), or
    None when it fits with margin."""
    free = gpu.memory_bytes - mem.total
    reserve = reserve_bytes(gpu)
    if free >= reserve:
        return None
    return (f"footprint {mem.total / GiB:.2f} GiB leaves {free / GiB:.2f} GiB of {gpu.name}'s "
            f"{gpu.memory_bytes / GiB:.2f} GiB free, less than its reserve of {reserve / GiB:.2f} GiB "
            f"({100 * gpu.memory_reserve:g} %)")


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
    recompute: str = "none",
    zero: int = 0,
    dp: int = 1,
    expandable: bool | None = None,
) -> StageMemory:
    """Memory of one tp rank of ``stage`` holding ``layers`` on a device of type ``gpu``; ``recompute`` and ZeRO
    stage ``zero`` over ``dp`` ranks as the module docstring says; ``expandable``: the allocator's
    ``expandable_segments`` (its fragmentation).

    ``layer_states``/``layer_acts`` may be passed precomputed (search hot path; they must match ``recompute`` and
    ``zero``)."""
    states = layer_state_bytes(model, tp, zero, dp) if layer_states is None else layer_states
    if layer_acts is None:
        layer_acts = layer_activation_bytes(model, tp, mbs, measured_activation, gpu.mask_bytes(model.bytes_per_elem),
                                            recompute)
    k = in_flight(schedule, stage, pp, gas, virtual_stages)
    sl = slice(layers.start, layers.stop)
    one = float(layer_acts[sl].sum())
    act = one * k
    dup = sum(n / (tp if model.layers[i].tp_shardable else 1)
              * state_bytes_per_param(model.dtype, not model.layers[i].trains_tied, zero, dp)
              for i, n in model.tied_duplicates(layers))
    state = float(states[sl].sum()) - dup
    interleaved = schedule == "interleaved" and virtual_stages > 1
    if interleaved:
        act /= virtual_stages  # counted in chunk micro-batches; `layers` is this chunk's layers
    last = layers.stop - 1
    transient = final_output_bytes(model, mbs, output_slots(stage, pp, gas), tp) if last == model.num_layers - 1 \
        else 0.0
    rec = recompute_working_bytes(model, layers, tp, mbs, gpu.mask_bytes(model.bytes_per_elem), recompute)
    if transient and rec:
        # the loss's working set is freed before any block's backward re-runs its forward: only the excess counts
        rec = max(0.0, rec - loss_bytes(model, mbs, tp))
    if k >= gas and not interleaved:
        # Every micro-batch is in flight at once: the first backward starts with k micro-batches' activations, no
        # gradient yet, and one layer's backward working set; gradients only coexist with k − 1 of them (later
        # backwards, each with its working set; none when k = 1: nothing runs once the gradients exist). Peak = the
        # larger of the two.
        grads = model.stage_params(layers, tp, trainable_only=True) * grad_bytes_per_param(model.dtype)
        later_rec = rec if k > 1 else 0.0
        if act + rec - grads >= (k - 1) * one + later_rec:
            state -= grads
        else:
            act, rec = (k - 1) * one, later_rec
    buffers = boundary_buffer_bytes(model, layers.start, last, stage, pp, mbs, gas, k)
    step_extra = optimizer_step_extra(model, layers, tp, mbs, zero, dp, float(states[sl].sum()) - dup, transient,
                                      state + act + buffers + transient)
    return StageMemory(state, act, float(buffers), transient, k, step_extra, rec, float(gpu.workspace_bytes),
                       allocator_fragmentation(gpu, expandable), float(gpu.context_bytes))


def optimizer_step_extra(model: Model, layers: range, tp: int, mbs: int, zero: int, dp: int, full_states: float,
                         transient: float, training_peak: float) -> float:
    """How much the optimizer step's peak (or the gradient all-reduce's) exceeds the stage's training peak, bytes
    (:func:`optimizer_step_peaks`; 0 where neither does). It sets the peak of a stage with few activations (an
    embedding-only stage).

    Args:
        full_states: the stage's states with every gradient, bytes.
        transient: the stage's final output and loss working set (0 before the last stage), bytes.
        training_peak: states + activations + buffers + transient at the training peak, bytes."""
    p = model.stage_params(layers, tp, trainable_only=True)
    extra = 0.0
    for peak in optimizer_step_peaks(model, mbs, zero, dp, p, full_states, transient, tp):
        extra = max(extra, peak - training_peak)
    return extra


def optimizer_step_peaks(model: Model, mbs: int, zero: int, dp: int, p: Any, full_states: Any,
                         transient: float, tp: int = 1) -> tuple[Any, ...]:
    """The optimizer step's peak, bytes, and where DeepSpeed flattens the gradients to all-reduce them the
    all-reduce's: every state with its gradient, the last stage's kept logits, and what the precision's optimizer
    adds there (:func:`state_bytes_per_param` names the optimizers).

    * fp32: nothing more; the plan's optimizer is torch's fused AdamW (ampe.costmodel.training), which keeps no
      per-tensor temporaries (measured on CPU: 0 bytes over entry for a 100 MB tensor; the foreach and for-loop
      AdamW hold one and two copies of it); with ZeRO an fp32 copy of the gradient partition and the buckets;
    * fp16/bf16 with ZeRO-1: the reduction buckets, the averaged gradient partition again at 16-bit and as fp32;
    * fp16 without ZeRO (FP16_UnfusedOptimizer.step): an fp32 copy of every gradient, 4 bytes per parameter;
    * bf16 without ZeRO (BF16_Optimizer.step): an fp32 copy of the gradient partition, 4/dp bytes per parameter;
    * dp > 1 without ZeRO at fp32/fp16: DeepSpeed's all-reduce flattens the stage's gradients into one buffer (a
      copy) after the last backward (CPU trials: it sets the peak of recomputed, data-parallel stages); BF16's
      accumulation buffer is already flat and is reduced in place (no second peak).

    Each peak is affine in ``p`` and ``full_states`` (which may be arrays: element by element), and for
    ``transient`` > 0 in ``transient``: the layer-assignment DP's memory bounds take it apart so
    (:mod:`ampe.costmodel.dp_memory`).

    Args:
        p: the stage's trainable parameters per tensor-parallel rank.
        full_states: the stage's states with every gradient, bytes.
        transient: the stage's final output and loss working set (0 before the last stage), bytes.
        tp: tensor-parallel degree (the last stage's loss working set per rank)."""
    kept_logits = transient - loss_bytes(model, mbs, tp) if transient else 0.0
    if model.dtype == "fp32":
        zero_grads = 4.0 * p / dp + ZERO_BUCKETS * ZERO_BUCKET_ELEMS * 4.0 if zero else 0.0
        step = full_states + kept_logits + zero_grads
    elif zero:
        step = full_states + 6.0 * p / dp + transient + ZERO_BUCKETS * ZERO_BUCKET_ELEMS * grad_bytes_per_param(
            model.dtype)
    else:
        step = full_states + kept_logits + 4.0 * p / (dp if model.dtype == "bf16" else 1)
    if dp > 1 and not zero and model.dtype != "bf16":
        return step, full_states + p * grad_bytes_per_param(model.dtype) + kept_logits
    return (step,)


def combine_chunks(parts: list[StageMemory]) -> StageMemory:
    """Memory of a device holding several model chunks (interleaved schedule): the tensors add, the workspaces and
    the context count once, the fragmentation follows the sum."""
    if len(parts) == 1:
        return parts[0]
    return StageMemory(
        states=sum(p.states for p in parts),
        activations=sum(p.activations for p in parts),
        buffers=sum(p.buffers for p in parts),
        transient=max(p.transient for p in parts),
        in_flight=parts[0].in_flight,
        optimizer_step=max(p.optimizer_step for p in parts),
        recompute=max(p.recompute for p in parts),
        workspace=parts[0].workspace,
        fragmentation_share=parts[0].fragmentation_share,
        context=parts[0].context,
    )


class Placed(NamedTuple):
    """A placed strategy's memory (:func:`placed_memory`): footprints in bytes, and why it does not fit."""

    per_stage: tuple[int, ...]  # the largest footprint of each stage's devices
    per_device: tuple[int, ...]  # footprint per device id (0: a device in no stage)
    oom_reason: str | None  # the first device whose footprint exceeds its capacity
    breakdown: tuple[StageMemory, ...]  # each stage's fullest device, by component
    risk: str | None  # the first device that fits but within its reserve (None when every device has margin)


def placed_memory(pp: int, lay: DeviceLayout, gpus: tuple[GpuType, ...], cluster: Cluster,
                  device_memory: Callable[[int, GpuType, int], tuple[StageMemory, int]],
                  shares: Sequence[int] | None = None) -> Placed:
    """The memory of a strategy placed as ``lay`` (:class:`Placed`); ``device_memory(stage, gpu, share)``: one
    tensor-parallel rank's breakdown and footprint (bytes) on a ``gpu`` device of that stage whose replica runs
    ``share`` micro-batches (0 under equal shares, given by ``shares=None``); ``gpus``: the GPU types by index.
    Devices of one type on one stage (and of one share) hold the same, so each (stage, GPU type, share) is costed
    once and spread over its devices."""
    n_types = len(gpus)
    levels = sorted(set(shares)) if shares is not None else [0]
    n_lv = len(levels)
    level_of = np.array([levels.index(g) for g in shares] if shares is not None else [0] * lay.grid.shape[1])
    # [stage] each device's (type, share level) as one index, replica then shard order
    keyed = lay.types * n_lv + level_of[None, :, None]
    values: list[int] = [0] * (pp * n_types * n_lv + 1)  # [1 + stage·T·S + key]; [0] a device in no stage
    per_stage = []
    breakdown = []
    reason = risk = None
    for dev_stage in range(pp):
        present = ([t * n_lv for t in lay.stage_types[dev_stage]] if shares is None
                   else np.unique(keyed[dev_stage]).tolist())
        mems = {k: device_memory(dev_stage, gpus[k // n_lv], levels[k % n_lv]) for k in present}
        for k, (_, total) in mems.items():
            values[1 + dev_stage * n_types * n_lv + k] = total
        per_stage.append(max(0, *(total for _, total in mems.values())))
        breakdown.append(max(mems.values(), key=lambda m: m[1])[0])
        over = [k for k, (_, total) in mems.items() if total > gpus[k // n_lv].memory_bytes]
        if over and reason is None:
            d, k = _first_device(keyed, lay, dev_stage, over)
            explained = mems[k][0].explain(gpus[k // n_lv])
            reason = f"stage {dev_stage} on device {d} ({cluster.devices[d].node}) {explained}"
        near = {k: why for k, (m, _) in mems.items() if k not in over and (why := memory_risk(m, gpus[k // n_lv]))}
        if near and risk is None:
            d, k = _first_device(keyed, lay, dev_stage, list(near))
            risk = f"stage {dev_stage} on device {d} ({cluster.devices[d].node}): {near[k]}"
    code = np.zeros(cluster.size, dtype=np.int64)
    code[lay.grid.reshape(-1)] = (1 + np.arange(pp)[:, None, None] * n_types * n_lv + keyed).reshape(-1)
    # one int object per (stage, type, share), shared by its devices: thousands of devices stay cheap to hold
    per_dev = tuple(map(values.__getitem__, code.tolist()))
    return Placed(tuple(per_stage), tuple(per_dev), reason, tuple(breakdown), risk)


def _first_device(keyed: np.ndarray, lay: DeviceLayout, stage: int, keys: list[int]) -> tuple[int, int]:
    """(device id, key of ``keyed``) of the first device of ``stage``, in rank order (replica, then shard), whose
    key is one of ``keys``."""
    stage_keys = keyed[stage].reshape(-1)
    first = int(np.flatnonzero(np.isin(stage_keys, keys))[0])
    return int(lay.grid[stage].reshape(-1)[first]), int(stage_keys[first])
