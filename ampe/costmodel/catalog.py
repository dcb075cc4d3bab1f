"""Built-in catalog of accelerator types.

Every figure names its source. Peak FLOP/s are *dense* (no sparsity). Memory is the usable capacity in bytes.
Clocks are SM (graphics) clocks in MHz as listed by ``nvidia-smi -q -d SUPPORTED_CLOCKS``; where a card exposes
irregular steps (V100: 7-8 MHz) the catalog gives the average step, and planners round to whole MHz.

The compute-efficiency fields (``matmul_efficiency``, ``gemm_overhead_s``, ``unaligned_efficiency``,
``memory_efficiency``, ``layer_overhead_s``)
are *model parameters* of ampe's analytic roofline, not datasheet values; they are documented in
``docs/cost_model.md`` and can be overridden per cluster spec (``gpu_types:``) or replaced by measured profiles.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ampe.costmodel.dvfs_params import DvfsParams, KernelPower

GiB = 1 << 30
MiB = 1 << 20


@dataclass(frozen=True)
class GpuType:
    """One accelerator type: capacity, speed, power and clock range."""

    name: str
    memory_bytes: int
    peak_flops_fp16: float  # dense fp16/bf16 tensor-core FLOP/s
    peak_flops_fp32: float  # dense fp32 FLOP/s on the SIMT cores (no TF32)
    memory_bandwidth: float  # bytes/s
    tdp_w: float  # board power limit, watts
    idle_w: float  # idle power, watts
    sm_clock_min_mhz: float
    sm_clock_max_mhz: float
    sm_clock_step_mhz: float
    # Roofline model parameters (see docs/cost_model.md).
    matmul_efficiency: float = 0.7  # best achievable fraction of peak FLOP/s, reached by large matrix products
    gemm_overhead_s: float = 5e-6  # seconds one matrix-product call costs beyond its work at matmul_efficiency
    unaligned_efficiency: float = 1.0  # factor on matmul_efficiency for a GEMM whose n or k is not a 16-byte multiple
    memory_efficiency: float = 0.7  # achievable fraction of memory bandwidth for memory-bound kernels
    layer_overhead_s: float = 2e-5  # fixed launch/framework cost per layer per pass
    # seconds one element-wise pass of a layer's kernel list costs beyond its bytes (launch, tail; an entry stands for
    # one to ten PyTorch kernels); 0 where no profile measured it
    pass_overhead_s: float = 0.0
    # The footprint beyond the model's tensors (ampe.costmodel.memory, docs/cost_model.md "The whole footprint"):
    # library workspaces torch allocates through its caching allocator (counted by max_memory_allocated), the
    # allocator's reserved-but-unallocated bytes per allocated byte at the peak (default allocator, and with
    # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), what the process holds outside PyTorch (CUDA context,
    # libraries' kernels), and the reserve a strategy must leave free to fit with margin (a fraction of the capacity)
    workspace_bytes: int = 96 * MiB
    fragmentation: float = 0.053
    fragmentation_expandable: float = 0.01
    context_bytes: int = int(1.65 * GiB)
    memory_reserve: float = 0.05
    # bytes per dropout-mask element: bool on CUDA; 0: the activations' own element size (PyTorch's CPU dropout
    # keeps its mask in the input's dtype: 4 bytes at fp32, 2 at bf16; measured, benchmarks/memory_probe.py)
    dropout_mask_bytes: int = 1
    # Extra seconds per forward/backward instruction of a stage in a pipeline (pp > 1), beyond its layers' profiled
    # times: 0 on GPUs (not observed); on CPU trials (DeepSpeed over gloo, one core per rank) measured, see
    # docs/fidelity.md.
    pipeline_op_s: float = 0.0
    # Seconds of per-iteration framework work per rank besides the optimizer's arithmetic (the engine's step
    # bookkeeping, loss and gradient-bucket handling): 0 on GPUs (it overlaps the GPU's queue); on CPU trials it
    # takes the core, measured, see docs/fidelity.md.
    iteration_overhead_s: float = 0.0
    # DVFS model parameters given by a cluster spec (`dvfs:`, e.g. from `ampe dvfs fit`); None: the catalog's
    # (ampe.energy.dvfs.PARAMS), derived from ``dvfs_base``'s where the type is a variant.
    dvfs: DvfsParams | None = None
    # The catalog type whose DVFS model this one derives from (a cluster spec's `base:`): its shape, with watts
    # scaled to this type's TDP (ampe.energy.dvfs.params_for, docs/energy.md §1). None: the type's own name.
    dvfs_base: str | None = None
    # Power at f_max by what bounds the kernels (fitted where a GPU record measured it: H100, H200); None: the DVFS
    # model's busy power for every computation (docs/energy.md §1).
    kernel_power: KernelPower | None = None
    # A straggler (a cluster spec's `stragglers:`, `ampe replan --slow`): its layers take ``slowdown`` times as long
    # as on the healthy type ``straggler_of`` (compute only: memory, links and power stay the healthy type's).
    slowdown: float = 1.0
    straggler_of: str | None = None
    # Dense TF32 tensor-core FLOP/s: fp32 matrix products where TF32 is allowed (Ampere and later). None: the type
    # has no TF32 tensor cores, so fp32 products run on the SIMT cores at ``peak_flops_fp32`` whatever is allowed.
    peak_flops_tf32: float | None = None
    sources: tuple[str, ...] = field(default=(), compare=False)

    def mask_bytes(self, bytes_per_elem: int) -> int:
        """Bytes per dropout-mask element on this device for activations of ``bytes_per_elem`` bytes."""
        return self.dropout_mask_bytes or bytes_per_elem

    @property
    def is_cpu(self) -> bool:
        """A CPU core: the ``cpu`` type, or a cluster spec's variant of it (``base: cpu``, e.g. a slower core for
        emulated mixed speeds)."""
        return self.name == "cpu" or self.dvfs_base == "cpu"

    def peak_flops(self, precision: str) -> float:
        """Peak dense FLOP/s of matrix products in ``precision``: "fp16" or "bf16" (tensor cores), "fp32" (SIMT),
        or "tf32" (fp32 products with TF32 allowed: the TF32 tensor-core rate, or the SIMT rate on a type without
        TF32)."""
        if precision == "tf32":
            return self.peak_flops_tf32 if self.peak_flops_tf32 is not None else self.peak_flops_fp32
        return self.peak_flops_fp32 if precision == "fp32" else self.peak_flops_fp16

    def tensor_cores(self, precision: str) -> bool:
        """Whether matrix products in ``precision`` run on tensor cores (whose kernels need 16-byte aligned leading
        dimensions): 16-bit always (every catalog type has them), TF32 where the type has a TF32 peak, fp32 never."""
        if precision == "tf32":
            return self.peak_flops_tf32 is not None
        return precision != "fp32"

    def sm_clocks_mhz(self) -> tuple[int, ...]:
        """All SM clocks from min to max in the catalog step, rounded to whole MHz, max always included."""
        clocks = []
        f = float(self.sm_clock_min_mhz)
        while f < self.sm_clock_max_mhz - 1e-9:
            clocks.append(round(f))
            f += self.sm_clock_step_mhz
        clocks.append(round(self.sm_clock_max_mhz))
        return tuple(sorted(set(clocks)))

    def with_overrides(self, **kwargs: Any) -> GpuType:
        """A copy with some fields replaced (used by cluster specs and calibration)."""
        return replace(self, **kwargs)

    def slowed(self, factor: float) -> GpuType:
        """This type as a straggler whose layers take ``factor`` (> 1) times as long, named ``<name> slow×F``
        (its DVFS model, memory and power stay the healthy type's: :meth:`healthy`)."""
        healthy = self.healthy()
        return replace(healthy, name=f"{healthy.name} slow×{factor:g}", slowdown=factor, straggler_of=healthy.name)

    def healthy(self) -> GpuType:
        """The type a straggler is a slowed copy of (itself when it is none)."""
        if self.straggler_of is None:
            return self
        return replace(self, name=self.straggler_of, slowdown=1.0, straggler_of=None)


_NV = "NVIDIA datasheet"
# benchmarks/power_fit.py's output, rounded (tests/costmodel/test_gpu_records_time_energy.py refits it): one fit for
# both GH100 cards, to the NVML energy of the H100 record (gpt2-medium, fp16) and the H200 record (Llama-3.2-1B, bf16)
_GH100_POWER = KernelPower(
    117.0, 754.5, 556.4, 508.3,
    source="fitted at f_max only (no clock may be changed on a lent GPU): NVML energy of every profiled layer and "
           "every trial in tests/data/h100 and tests/data/h200/gpu_check, H100 and H200 jointly (same GH100 die; "
           "benchmarks/power_fit.py)")
_TF32 = "TF32 tensor core, dense (half the datasheet's with-sparsity figure): {} TFLOPS ({})"
_SMI = "nvidia-smi -q -d SUPPORTED_CLOCKS"
_ROOFLINE = ("roofline priors, not measured here (docs/cost_model.md): matmul_efficiency 0.7 (large cuBLAS GEMMs reach "
             "about 70-80 % of the dense tensor peak), gemm_overhead_s 5 µs (launch, partly filled first and last "
             "waves), memory_efficiency 0.7, layer_overhead_s 20 µs")


def _unaligned(simt_tflops: float, tensor_tflops: float) -> str:
    return (f"unaligned_efficiency: a 16-bit GEMM with n or k not a multiple of 8 runs about at the non-tensor-core "
            f"rate, {simt_tflops:g} / ({tensor_tflops:g} TFLOPS × matmul_efficiency 0.7) (this rule gives 0.19 on "
            "the H100, where 0.20 was measured)")


# Every CUDA type's footprint beyond the model's tensors (the GpuType fields; docs/cost_model.md)
_FOOTPRINT = ("footprint (docs/cost_model.md, The whole footprint): context_bytes 1.65 GiB measured on the H200 "
              "(the OOM message of tests/data/h200/gpu_check: 138.94 GiB in use by the process, 130.39 allocated "
              "and 6.90 reserved by PyTorch; torch 2.11 cu130, driver 580), assumed for the other CUDA types; "
              "fragmentation 0.053 measured there (6.90 GiB reserved-but-unallocated at 130.39 GiB allocated, "
              "default allocator); fragmentation_expandable 0.01 assumed, not measured (benchmarks/gpu_check.sh's "
              "expandable_segments on/off trials record it); workspace_bytes 96 MiB fitted: what the H100 and H200 "
              "records' allocated peaks hold beyond every modelled tensor, 65-82 MiB (two 32 MiB cuBLAS workspaces "
              "and kernel workspaces); memory_reserve 0.05 of the capacity, about one measured fragmentation")

CATALOG: dict[str, GpuType] = {
    g.name: g if g.name == "cpu" else replace(g, sources=(*g.sources, _FOOTPRINT))
    for g in (
        GpuType(
            "V100-16GB", 16 * GiB, 125e12, 15.7e12, 900e9, 300.0, 40.0, 135, 1530, 7.5,
            unaligned_efficiency=0.36,
            sources=(f"{_NV} Tesla V100 SXM2 (125 TFLOPS tensor, 15.7 TFLOPS fp32, 900 GB/s, 300 W)",
                     f"{_SMI} on p3.8xlarge: 135-1530 MHz", "idle: typical nvidia-smi reading, 35-45 W", _ROOFLINE,
                     _unaligned(31.4, 125)),
        ),
        GpuType(
            "V100-32GB", 32 * GiB, 125e12, 15.7e12, 900e9, 300.0, 40.0, 135, 1530, 7.5,
            unaligned_efficiency=0.36,
            sources=(f"{_NV} Tesla V100 SXM2 32GB", f"{_SMI}: 135-1530 MHz", "idle: typical reading", _ROOFLINE,
                     _unaligned(31.4, 125)),
        ),
        GpuType(
            "T4", 15 * GiB, 65e12, 8.1e12, 320e9, 70.0, 10.0, 300, 1590, 15,
            sources=(f"{_NV} Tesla T4 (65 TFLOPS fp16, 8.1 TFLOPS fp32, 320 GB/s, 70 W; 15 GiB usable of 16 GB)",
                     f"{_SMI} on g4dn: 300-1590 MHz", "idle: P8 reading about 10 W", _ROOFLINE,
                     _unaligned(16.2, 65)),
            unaligned_efficiency=0.36,
        ),
        GpuType(
            "A100-40GB", 40 * GiB, 312e12, 19.5e12, 1555e9, 400.0, 55.0, 210, 1410, 15, peak_flops_tf32=156e12,
            sources=(f"{_NV} A100 SXM4 40GB (312 TFLOPS bf16 dense, 19.5 TFLOPS fp32, 1555 GB/s, 400 W)",
                     _TF32.format(156, "NVIDIA A100 datasheet: 156 / 312 with sparsity"),
                     "Perseus paper §6.1: A100 clocks 210-1410 MHz", "idle: typical reading 50-60 W", _ROOFLINE,
                     _unaligned(78, 312)),
            unaligned_efficiency=0.36,
        ),
        GpuType(
            "A100-80GB", 80 * GiB, 312e12, 19.5e12, 2039e9, 400.0, 60.0, 210, 1410, 15, peak_flops_tf32=156e12,
            sources=(f"{_NV} A100 SXM4 80GB (312 TFLOPS, 19.5 TFLOPS fp32, 2039 GB/s, 400 W)",
                     _TF32.format(156, "NVIDIA A100 datasheet: 156 / 312 with sparsity"),
                     "Perseus paper §6.1: 210-1410 MHz", "idle: typical reading", _ROOFLINE, _unaligned(78, 312)),
            unaligned_efficiency=0.36,
        ),
        GpuType(
            "A40", 48 * GiB, 149.7e12, 37.4e12, 696e9, 300.0, 30.0, 210, 1740, 15, peak_flops_tf32=74.8e12,
            sources=(f"{_NV} A40 (149.7 TFLOPS fp16 tensor dense, 37.4 TFLOPS fp32, 696 GB/s, 300 W)",
                     _TF32.format(74.8, "NVIDIA A40 datasheet: 74.8 / 149.6 with sparsity"),
                     "Perseus paper §6.1: A40 clocks 210-1740 MHz", "idle: typical reading", _ROOFLINE,
                     _unaligned(37.4, 149.7)),
            unaligned_efficiency=0.36,
        ),
        GpuType(
            "H100-80GB", 80 * GiB, 989e12, 67e12, 3350e9, 700.0, 70.0, 345, 1980, 15, peak_flops_tf32=494.7e12,
            sources=(f"{_NV} H100 SXM5 (989 TFLOPS bf16 dense, 67 TFLOPS fp32, 3.35 TB/s, 700 W)",
                     _TF32.format(494.7, "NVIDIA H100 SXM datasheet: 989 with sparsity"),
                     "Perseus paper §6.1: H100 SXM max 1980 MHz; min 345 MHz per nvidia-smi (approximate)",
                     "idle: typical reading 60-80 W", _ROOFLINE.replace("memory_efficiency 0.7, ", ""),
                     "measured: memory_efficiency 0.67 and pass_overhead_s 32 µs, fitted to the time of gpt2-medium's "
                     "blocks (memory-bound eager attention) at mbs 4 and 8 (the slope fixes the one, the intercept the "
                     "other: 0.673, 31.5 µs), then unaligned_efficiency 0.19 to the time per sample of its LM head "
                     "(vocabulary 50,257), in tests/data/h100 (benchmarks/roofline_fidelity.py --fit)"),
            memory_efficiency=0.67, pass_overhead_s=32e-6, unaligned_efficiency=0.19, kernel_power=_GH100_POWER,
        ),
        GpuType(
            "H200", 139 * GiB, 989e12, 67e12, 4800e9, 700.0, 70.0, 345, 1980, 15, peak_flops_tf32=494.7e12,
            sources=(f"{_NV} H200 SXM (989 TFLOPS bf16 dense, 67 TFLOPS fp32, 4.8 TB/s HBM3e, 141 GB, 700 W)",
                     _TF32.format(494.7, "NVIDIA H200 datasheet: 989 with sparsity"),
                     "usable memory: about 139 GiB, as the lent H200 machines report", "clocks and idle power: the "
                     "H100 SXM's (same GH100 die)",
                     "measured: memory_efficiency 0.52 and pass_overhead_s 32 µs, fitted to the time of Llama-3.2-1B's "
                     "blocks at seq 4096, eager and flash, mbs 2 and 4, in "
                     "tests/data/h200/gpu_check (benchmarks/roofline_fidelity.py --fit: 0.522, 32.6 µs; the H100's "
                     "gpt2-medium blocks give 31.5 µs)",
                     "unaligned_efficiency: the H100's (same die; Llama's vocabulary is aligned, so nothing on the "
                     "H200 measures it)"),
            memory_efficiency=0.52, pass_overhead_s=32e-6, unaligned_efficiency=0.19, kernel_power=_GH100_POWER,
        ),
        GpuType(
            "RTX3090", 24 * GiB, 71e12, 35.6e12, 936e9, 350.0, 25.0, 210, 2100, 15,
            sources=(f"{_NV} GeForce RTX 3090 / Ampere GA102 whitepaper (71 TFLOPS fp16 tensor w/ fp32 accumulate, "
                     "35.6 TFLOPS fp32, 936 GB/s, 350 W)", "EnvPipe testbed clocks up to 2100 MHz (approximate)",
                     "idle: typical reading", _ROOFLINE, _unaligned(35.6, 71)),
            unaligned_efficiency=0.72,
        ),
        GpuType(
            # One CPU core running one trial rank. There is no RAPL or cpufreq on the machines this was written on,
            # so power and clock figures are a *model* (labelled so in every output), not measurements.
            "cpu", 10 * GiB, 1.13e11, 1.13e11, 8e9, 15.0, 5.0, 1000, 3000, 100,
            matmul_efficiency=1.0, memory_efficiency=0.5, layer_overhead_s=5e-5,
            workspace_bytes=0, fragmentation=0.0, fragmentation_expandable=0.0, context_bytes=300 * MiB,
            dropout_mask_bytes=0, pipeline_op_s=1.5e-3,
            iteration_overhead_s=6e-3,
            sources=("measured: peak = the best GEMM rate on one core of the development VM (AMD EPYC, AVX-512), "
                     "113 GFLOP/s fp32 in the gpt2-tiny LM head's backward (tests/data/cpu_trials_quiet/profile.csv;"
                     " benchmarks/roofline_fidelity.py), so matmul_efficiency 1 (bf16 runs at fp32 speed)",
                     "modelled: about 8 GB/s of DRAM bandwidth per core", "modelled: 15 W per core busy, 5 W idle",
                     "modelled clock range 1000-3000 MHz; no cpufreq here, so nothing is ever set",
                     "measured: pipeline_op_s, gpt2-tiny pp 2 vs pp 1 DeepSpeed trials with per-layer timing on an "
                     "idle 2-core VM (docs/fidelity.md)",
                     "measured: iteration_overhead_s, CPU time per rank and iteration outside forward/backward "
                     "instructions minus the modelled optimizer step, median over the ranks of 2-core DeepSpeed "
                     "trials (docs/fidelity.md)",
                     "context_bytes 300 MiB: the interpreter, torch, DeepSpeed and gloo buffers of a rank, beside its "
                     "tensors (docs/fidelity.md); no caching allocator (fragmentation 0), no library workspaces"),
        ),
    )
}


def emulated_slowdowns(types: Sequence[GpuType], precision: str) -> tuple[float, ...]:
    """How much longer each of ``types`` computes than the fastest of them, by peak FLOP/s at ``precision``
    (≥ 1; 1.0 for the fastest): what a CPU trial stretches each rank's forward and backward by to emulate a cluster
    of mixed speeds on identical cores (docs/trials.md, "Emulated mixed speeds"). Peak FLOP/s, not a measured
    ratio: it is the figure every catalog type has, and the roofline term it scales dominates the cost model's
    compute time; a spec written for emulation scales its type's memory bandwidth alike."""
    fastest = max(g.peak_flops(precision) for g in types)
    return tuple(fastest / g.peak_flops(precision) for g in types)


def get_gpu_type(name: str, extra: dict[str, GpuType] | None = None) -> GpuType | None:
    """Look up a type by name in ``extra`` (cluster-spec overrides) first, then the built-in catalog."""
    if extra and name in extra:
        return extra[name]
    return CATALOG.get(name)
