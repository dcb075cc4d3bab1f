"""ampe.measure: measurement primitives used in-process by the runtime and the profiler.

Frequency controllers and energy meters behind one interface (NVML, emulated, none), CPU and CUDA memory probes, and
the host's CPU load. Modules that need torch or NVML import them where they are used, so the package works on a
machine without either.

What it may import is docs/layout.md's table (checked by tests/test_layout.py).
"""
