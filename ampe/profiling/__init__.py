"""ampe.profiling: ``ampe profile``'s measurements, run in their own processes with torch: per-layer forward/backward
time, activation memory and energy of the runtime's own layers, and a CPU's time-sharing efficiency.

May import: ampe.runtime (the layers it times), ampe.measure, ampe.costmodel, ampe.errors, ampe.io.
"""
