"""What ``ampe profile`` will cost, estimated from the cost model before anything is built (no torch here), and the
bounds it must stay within.

* **Memory.** Layers are built and timed one at a time, so the peak is the largest layer's: its weights (on the
  host: in fp32 as built, plus a converted copy at another precision; on a GPU: at the profiled precision), their
  gradients, the activations autograd keeps for one micro-batch
  (:meth:`ampe.costmodel.model.Layer.act_bytes`, at the profiled precision), the input, its gradient and the output
  gradient (three ``mbs × seq × hidden`` tensors), and for the LM head the fp32 logits, their softmax and gradient
  (three ``mbs × seq × vocab``). Refused when it exceeds :data:`MEMORY_SHARE` of the memory available: on CPU
  ``MemAvailable`` (and ``RLIMIT_AS``), on CUDA the device's free memory — ``--mbs 100000000`` or GPT-3 175B's
  7 GB layers on a small machine end here with one line, not in an allocator traceback.
* **Time.** (warm-up + repeats) × the layers' forward + backward time from the roofline model of the device's
  catalog type (``cpu``: one core), for every tp, mbs and recomputation mode, plus the NVML energy window per layer
  on CUDA (unless ``--no-energy``). Refused
  beyond :data:`MAX_PROFILE_S`; ``--repeats`` and ``--warmup`` are also capped at :data:`MAX_REPEATS` (the median of
  10 is already stable).
"""

from __future__ import annotations

import resource
from collections.abc import Sequence
from dataclasses import dataclass

from ampe.costmodel.catalog import GpuType
from ampe.costmodel.compute import roofline_times
from ampe.costmodel.model import Model
from ampe.errors import InputError

MAX_PROFILE_S = 4 * 3600.0  # estimated seconds of one `ampe profile` run
MAX_REPEATS = 10_000  # --repeats and --warmup
MEMORY_SHARE = 0.8  # of the memory available now
TORCH_BASE_BYTES = 512 << 20  # torch, its allocator and the interpreter
ENERGY_WINDOW_S = 0.5  # per layer on CUDA with NVML (ampe.profiling.profiler.ENERGY_WINDOW_S)
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class ProfileCost:
    """Estimated peak bytes of the largest layer (at which tp, mbs and layer) and seconds of the whole run."""

    peak_bytes: float
    peak_at: str
    seconds: float


def estimate(model: Model, gpu: GpuType, tps: Sequence[int], mbss: Sequence[int], warmup: int, repeats: int,
             dtype: str, energy: bool = False, shared: bool = False, modes: int = 1) -> ProfileCost:
    """The cost of profiling ``model`` on ``gpu`` (its catalog type) at every tp and mbs (module docstring).
    ``shared``: the tp processes share one memory (CPU), so a layer's bytes count tp times; ``modes``: recomputation
    modes measured (each layer is timed once per mode, an upper bound: a layer without recomputation is copied)."""
    b = BYTES[dtype]
    scale = b / model.bytes_per_elem  # the model's activation bytes are at its own precision
    mask = gpu.mask_bytes(b)
    # a layer is built in fp32 on the host, then converted (a copy unless it already is fp32) or moved to the GPU;
    # its gradients are at the profiled precision
    per_param = (4 + (b if b != 4 else 0) + b) if shared else 2 * b
    peak, at, seconds = 0.0, "", 0.0
    timed = model if dtype == model.dtype else _at_dtype(model, dtype)
    for tp in tps:
        for mbs in mbss:
            fwd, bwd = roofline_times(timed, gpu, tp, mbs)
            seconds += float((fwd + bwd).sum()) * (warmup + repeats + 1) * modes
            seconds += ENERGY_WINDOW_S * model.num_layers * modes if energy else 0.0
            io_elems = 3.0 * mbs * max(model.seq_len, 1) * max(model.hidden, 1)
            for i, layer in enumerate(model.layers):
                need = (layer.params_per_rank(tp) * per_param + layer.act_bytes(tp, mask) * mbs * scale
                        + io_elems * b)
                if layer.kind == "logits":
                    need += 3.0 * mbs * max(model.seq_len, 1) * max(model.vocab, 1) * 4
                need *= tp if shared else 1
                if need > peak:
                    peak, at = need, f"layer {i} ({layer.kind}) at tp {tp}, mbs {mbs}"
    return ProfileCost(peak + TORCH_BASE_BYTES * (max(tps) if shared else 1), at, seconds)


def _at_dtype(model: Model, dtype: str) -> Model:
    from dataclasses import replace

    return replace(model, dtype=dtype)


def cpu_memory_available() -> float | None:
    """Bytes this process may still allocate on the host: MemAvailable, lowered by RLIMIT_AS; None if unknown."""
    avail = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        avail = soft if avail is None else min(avail, float(soft))
    return avail


def check(cost: ProfileCost, available: float | None, model: Model, device: str) -> None:
    """Refuse the run when it would not fit in memory or would take longer than MAX_PROFILE_S (InputError naming
    the flag to change)."""
    gib = 1 << 30
    if available is not None and cost.peak_bytes > MEMORY_SHARE * available:
        raise InputError("--mbs", "", f"profiling {model.name} needs about {cost.peak_bytes / gib:.3g} GiB at "
                         f"{cost.peak_at} (cost model: weights, gradients, activations, inputs), but {device} has "
                         f"{available / gib:.3g} GiB available: lower --mbs/--tp, or profile on a larger device")
    if cost.seconds > MAX_PROFILE_S:
        raise InputError("--repeats", "", f"profiling {model.name} would take about {cost.seconds / 3600:.3g} h on "
                         f"{device} (cost model: (warm-up + repeats) × every layer's forward and backward, every tp "
                         f"and mbs); at most {MAX_PROFILE_S / 3600:g} h: fewer --repeats/--warmup, fewer --mbs/--tp "
                         "values, or a faster device")


def check_counts(warmup: int, repeats: int) -> None:
    """Refuse --warmup/--repeats outside 0..MAX_REPEATS / 1..MAX_REPEATS before anything else."""
    if warmup < 0 or warmup > MAX_REPEATS:
        raise InputError("--warmup", "", f"must be 0..{MAX_REPEATS}, got {warmup}")
    if repeats < 1 or repeats > MAX_REPEATS:
        raise InputError("--repeats", "", f"must be 1..{MAX_REPEATS} (the median of 10 is already stable), got "
                         f"{repeats}")
