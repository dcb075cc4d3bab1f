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

from dataclasses import dataclass, field, replace
from typing import Any

from ampe.costmodel.dvfs_params import DvfsParams

GiB = 1 << 30


@dataclass(frozen=True)
class GpuType:
    """One accelerator type: capacity, speed, power and clock range."""

    name: str
    memory_bytes: int
    peak_flops_fp16: float  # dense fp16/bf16 tensor-core FLOP/s
    peak_flops_fp32: float  # dense fp32 FLOP/s (no TF32)
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
    reserved_bytes: int = GiB  # CUDA context, allocator fragmentation, workspace
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
    # A straggler (a cluster spec's `stragglers:`, `ampe replan --slow`): its layers take ``slowdown`` times as long
    # as on the healthy type ``straggler_of`` (compute only: memory, links and power stay the healthy type's).
    slowdown: float = 1.0
    straggler_of: str | None = None
    sources: tuple[str, ...] = field(default=(), compare=False)

    def mask_bytes(self, bytes_per_elem: int) -> int:
        """Bytes per dropout-mask element on this device for activations of ``bytes_per_elem`` bytes."""
        return self.dropout_mask_bytes or bytes_per_elem

    def peak_flops(self, dtype: str) -> float:
        """Peak dense FLOP/s for ``dtype`` ("fp16", "bf16" or "fp32")."""
        return self.peak_flops_fp32 if dtype == "fp32" else self.peak_flops_fp16

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
_SMI = "nvidia-smi -q -d SUPPORTED_CLOCKS"
_ROOFLINE = ("roofline priors, not measured here (docs/cost_model.md): matmul_efficiency 0.7 (large cuBLAS GEMMs reach "
             "about 70-80 % of the dense tensor peak), gemm_overhead_s 5 µs (launch, partly filled first and last "
             "waves), memory_efficiency 0.7, layer_overhead_s 20 µs")


def _unaligned(simt_tflops: float, tensor_tflops: float) -> str:
    return (f"unaligned_efficiency: a 16-bit GEMM with n or k not a multiple of 8 runs about at the non-tensor-core "
            f"rate, {simt_tflops:g} / ({tensor_tflops:g} TFLOPS × matmul_efficiency 0.7) (this rule gives 0.19 on "
            "the H100, where 0.20 was measured)")


CATALOG: dict[str, GpuType] = {
    g.name: g
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
            "A100-40GB", 40 * GiB, 312e12, 19.5e12, 1555e9, 400.0, 55.0, 210, 1410, 15,
            sources=(f"{_NV} A100 SXM4 40GB (312 TFLOPS bf16 dense, 19.5 TFLOPS fp32, 1555 GB/s, 400 W)",
                     "Perseus paper §6.1: A100 clocks 210-1410 MHz", "idle: typical reading 50-60 W", _ROOFLINE,
                     _unaligned(78, 312)),
            unaligned_efficiency=0.36,
        ),
        GpuType(
            "A100-80GB", 80 * GiB, 312e12, 19.5e12, 2039e9, 400.0, 60.0, 210, 1410, 15,
            sources=(f"{_NV} A100 SXM4 80GB (312 TFLOPS, 19.5 TFLOPS fp32, 2039 GB/s, 400 W)",
                     "Perseus paper §6.1: 210-1410 MHz", "idle: typical reading", _ROOFLINE, _unaligned(78, 312)),
            unaligned_efficiency=0.36,
        ),
        GpuType(
            "A40", 48 * GiB, 149.7e12, 37.4e12, 696e9, 300.0, 30.0, 210, 1740, 15,
            sources=(f"{_NV} A40 (149.7 TFLOPS fp16 tensor dense, 37.4 TFLOPS fp32, 696 GB/s, 300 W)",
                     "Perseus paper §6.1: A40 clocks 210-1740 MHz", "idle: typical reading", _ROOFLINE,
                     _unaligned(37.4, 149.7)),
            unaligned_efficiency=0.36,
        ),
        GpuType(
            "H100-80GB", 80 * GiB, 989e12, 67e12, 3350e9, 700.0, 70.0, 345, 1980, 15,
            sources=(f"{_NV} H100 SXM5 (989 TFLOPS bf16 dense, 67 TFLOPS fp32, 3.35 TB/s, 700 W)",
                     "Perseus paper §6.1: H100 SXM max 1980 MHz; min 345 MHz per nvidia-smi (approximate)",
                     "idle: typical reading 60-80 W", _ROOFLINE.replace("memory_efficiency 0.7, ", ""),
                     "measured: memory_efficiency 0.57 and unaligned_efficiency 0.20, fitted to the time per sample "
                     "(mbs 4 to 8) of gpt2-medium's blocks (memory-bound eager attention) and LM head (vocabulary "
                     "50,257) in tests/data/h100 (benchmarks/roofline_fidelity.py --fit)"),
            memory_efficiency=0.57, unaligned_efficiency=0.2,
        ),
        GpuType(
            "H200", 139 * GiB, 989e12, 67e12, 4800e9, 700.0, 70.0, 345, 1980, 15,
            sources=(f"{_NV} H200 SXM (989 TFLOPS bf16 dense, 67 TFLOPS fp32, 4.8 TB/s HBM3e, 141 GB, 700 W)",
                     "usable memory: about 139 GiB, as the lent H200 machines report", "clocks and idle power: the "
                     "H100 SXM's (same GH100 die)", "memory_efficiency and unaligned_efficiency: the H100's fitted "
                     "values (same die; not measured on an H200)"),
            memory_efficiency=0.57, unaligned_efficiency=0.2,
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
            reserved_bytes=300 * (1 << 20), dropout_mask_bytes=0, pipeline_op_s=1.5e-3,
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
                     "trials (docs/fidelity.md)"),
        ),
    )
}


def get_gpu_type(name: str, extra: dict[str, GpuType] | None = None) -> GpuType | None:
    """Look up a type by name in ``extra`` (cluster-spec overrides) first, then the built-in catalog."""
    if extra and name in extra:
        return extra[name]
    return CATALOG.get(name)
