"""ampe.measure: measurement primitives used in-process by the runtime and the profiler.

Frequency controllers and energy meters behind one interface (NVML, emulated, none), CPU and CUDA memory probes, and
the host's CPU load. Modules that need torch or NVML import them where they are used, so the package works on a
machine without either.

May import: ampe.costmodel (GPU types), ampe.energy.dvfs, ampe.errors, ampe.io.
"""
