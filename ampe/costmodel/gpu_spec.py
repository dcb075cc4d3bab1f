"""A cluster spec's ``gpu_types`` entries (pydantic, at the I/O edge) → :class:`~ampe.costmodel.catalog.GpuType`:
new types, variants of catalog types (``base:``) and their DVFS models (docs/reference/cluster_spec.md)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from ampe.costmodel.catalog import CATALOG, GpuType, get_gpu_type
from ampe.costmodel.dvfs_params import DvfsParams, scaled_kernel_power
from ampe.costmodel.spec_base import (
    ExtraMemoryGB,
    GBps,
    MemoryGB,
    Mhz,
    OverheadS,
    PricePerHour,
    SpecModel,
    Tflops,
    Watts,
)
from ampe.errors import InputError, suggest

MAX_CLOCK_STEPS = 4096  # clocks per GPU type (real cards expose about 100)
MAX_MEMORY_BYTES = 1 << 50


class DvfsSpec(SpecModel):
    """`gpu_types.<T>.dvfs`: the DVFS model's parameters (docs/energy.md §1; `ampe dvfs fit` writes them)."""

    compute_share: float = Field(gt=0, le=1)
    static_share: float = Field(ge=0, lt=1)
    busy_w: Watts = Field(gt=0)
    blocking_w: Watts
    sharpness: float = Field(default=1.0, ge=1, le=64)
    static_voltage_share: float = Field(default=0.0, ge=0, le=1)
    voltage_knee: float = Field(default=0.0, ge=0, lt=1)
    memory_share: float = Field(default=0.0, ge=0, lt=1)
    activity_slope: float = Field(default=0.0, ge=0, le=2)
    activity_memory_slope: float = Field(default=0.0, ge=-1, le=0)
    power_cap_w: Watts | None = Field(default=None, gt=0)
    source: str = "cluster spec"

    @field_validator("blocking_w")
    @classmethod
    def _waiting_draws_less(cls, v: float, info: Any) -> float:
        busy = info.data.get("busy_w")
        if busy is not None and v > busy:
            raise ValueError(f"{v:g} W while waiting is above busy_w {busy:g} W; a GPU draws less waiting than "
                             "computing")
        return v

    @field_validator("memory_share")
    @classmethod
    def _shares_fit(cls, v: float, info: Any) -> float:
        if v + info.data.get("static_share", 0.0) > 1.0:
            raise ValueError("static_share + memory_share must be at most 1")
        return v


class GpuTypeSpec(SpecModel):
    """`gpu_types.<T>`: a GPU type the spec adds, or a variant of a catalog type (`base:`) with some fields
    overridden (units as the catalog's: GB, TFLOP/s, GB/s, W, MHz, s)."""

    base: str | None = None  # copy an existing catalog entry and override some fields
    memory_gb: MemoryGB | None = None
    peak_tflops_fp16: Tflops | None = None
    peak_tflops_fp32: Tflops | None = None
    peak_tflops_tf32: Tflops | None = None  # dense TF32 tensor-core rate; absent: no TF32 (fp32 runs on SIMT cores)
    memory_bandwidth_gbs: GBps | None = None
    tdp_w: Watts | None = Field(default=None, gt=0)
    idle_w: Watts | None = None
    sm_clock_min_mhz: Mhz | None = None
    sm_clock_max_mhz: Mhz | None = None
    sm_clock_step_mhz: Mhz | None = None
    matmul_efficiency: float | None = Field(default=None, gt=0, le=1)
    gemm_overhead_s: OverheadS | None = Field(default=None, le=1)
    unaligned_efficiency: float | None = Field(default=None, gt=0, le=1)
    tokens_half: float | None = None  # replaced by gemm_overhead_s: refused with a pointer (_build_gpu_type)
    memory_efficiency: float | None = Field(default=None, gt=0, le=1)
    layer_overhead_s: OverheadS | None = None
    pass_overhead_s: OverheadS | None = None
    reserved_gb: float | None = None  # replaced by the footprint's named parts: refused with a pointer (below)
    # the footprint beyond the model's tensors (ampe.costmodel.memory; docs/reference/cluster_spec.md)
    workspace_gb: ExtraMemoryGB | None = None
    context_gb: ExtraMemoryGB | None = None
    fragmentation: float | None = Field(default=None, ge=0, le=1)
    fragmentation_expandable: float | None = Field(default=None, ge=0, le=1)
    memory_reserve: float | None = Field(default=None, ge=0, lt=1)
    pipeline_op_s: OverheadS | None = None
    iteration_overhead_s: OverheadS | None = None
    dvfs: DvfsSpec | None = None
    price_per_hour: PricePerHour | None = None  # currency units per GPU-hour (not part of the type)



_GPU_FIELD_MAP = {
    "memory_gb": ("memory_bytes", lambda v: int(v * 1e9)),
    "peak_tflops_fp16": ("peak_flops_fp16", lambda v: v * 1e12),
    "peak_tflops_fp32": ("peak_flops_fp32", lambda v: v * 1e12),
    "peak_tflops_tf32": ("peak_flops_tf32", lambda v: v * 1e12),
    "memory_bandwidth_gbs": ("memory_bandwidth", lambda v: v * 1e9),
    "workspace_gb": ("workspace_bytes", lambda v: int(v * 1e9)),
    "context_gb": ("context_bytes", lambda v: int(v * 1e9)),
}


def build_gpu_type(source: str, name: str, spec: GpuTypeSpec) -> GpuType:
    """The GPU type of a spec's ``gpu_types.<name>`` entry (a catalog copy with overrides, or a new type with every
    required field). Raises InputError naming ``source`` and the field."""
    if spec.tokens_half is not None:
        raise InputError(source, f"gpu_types.{name}.tokens_half", "no longer used: the roofline's matrix-product "
                         "efficiency now saturates on each GEMM's own work; give gemm_overhead_s (seconds one GEMM "
                         "call costs beyond its work; docs/cost_model.md)")
    if spec.reserved_gb is not None:
        raise InputError(source, f"gpu_types.{name}.reserved_gb", "no longer used: the footprint beyond the model's "
                         "tensors has named parts now; give context_gb (what the process holds outside PyTorch), "
                         "workspace_gb, fragmentation (the allocator's, a fraction of the allocated peak) or "
                         "memory_reserve (the margin a strategy leaves free, a fraction of memory_gb) "
                         "(docs/reference/cluster_spec.md)")
    base = get_gpu_type(spec.base) if spec.base else CATALOG.get(name)
    if spec.base and base is None:
        close = suggest(spec.base, CATALOG)
        raise InputError(source, f"gpu_types.{name}.base", f"unknown GPU type {spec.base!r}"
                         + (f" (did you mean {close}?)" if close else ""))
    values: dict[str, Any] = {}
    for key, val in spec.model_dump(exclude_none=True).items():
        if key in ("base", "price_per_hour"):
            continue
        if key == "dvfs":
            values["dvfs"] = DvfsParams(**val)
            continue
        target, conv = _GPU_FIELD_MAP.get(key, (key, lambda v: v))
        values[target] = conv(val)
    if base is not None:
        # A variant keeps the DVFS model of the catalog type it copies (scaled to its own TDP, docs/energy.md §1),
        # and its power by kernel bound likewise
        gpu = base.with_overrides(name=name, dvfs_base=base.dvfs_base or base.name, **values)
        if gpu.kernel_power is not None and gpu.tdp_w != base.tdp_w:
            gpu = gpu.with_overrides(kernel_power=scaled_kernel_power(gpu.kernel_power, base.name,
                                                                      gpu.tdp_w / base.tdp_w))
    else:
        required = {"memory_bytes", "peak_flops_fp16", "peak_flops_fp32", "memory_bandwidth", "tdp_w", "idle_w",
                    "sm_clock_min_mhz", "sm_clock_max_mhz", "sm_clock_step_mhz"}
        inv = {v[0]: k for k, v in _GPU_FIELD_MAP.items()}
        missing = sorted(inv.get(m, m) for m in required - set(values))  # the spec's names, every one at once
        if len(missing) == 1:
            raise InputError(source, f"gpu_types.{name}.{missing[0]}",
                             "required for a GPU type that is not in the catalog (or give `base:`)")
        if missing:
            raise InputError(source, f"gpu_types.{name}", f"missing {', '.join(missing)}: required for a GPU type "
                             "that is not in the catalog (or give `base:` to copy one)")
        gpu = GpuType(name=name, sources=(f"cluster spec {source}",), **values)
    if gpu.sm_clock_min_mhz > gpu.sm_clock_max_mhz:
        raise InputError(source, f"gpu_types.{name}.sm_clock_min_mhz", "is above sm_clock_max_mhz")
    if gpu.idle_w > gpu.tdp_w:
        raise InputError(source, f"gpu_types.{name}.idle_w", f"{gpu.idle_w:g} W idle is above the {gpu.tdp_w:g} W "
                         "board power limit (tdp_w)")
    steps = (gpu.sm_clock_max_mhz - gpu.sm_clock_min_mhz) / gpu.sm_clock_step_mhz
    if steps > MAX_CLOCK_STEPS:
        raise InputError(source, f"gpu_types.{name}.sm_clock_step_mhz", f"{steps:.3g} clock steps from "
                         f"{gpu.sm_clock_min_mhz:g} to {gpu.sm_clock_max_mhz:g} MHz; at most {MAX_CLOCK_STEPS}")
    if gpu.memory_bytes > MAX_MEMORY_BYTES:
        raise InputError(source, f"gpu_types.{name}.memory_gb", "more than 1 PB of device memory")
    return gpu
