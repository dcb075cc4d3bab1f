"""ampe.profiling: ``ampe profile``'s measurements, run in their own processes with torch: per-layer forward/backward
time, activation memory and energy of the runtime's own layers, and a CPU's time-sharing efficiency.

What it may import is docs/layout.md's table (checked by tests/test_layout.py).
"""
