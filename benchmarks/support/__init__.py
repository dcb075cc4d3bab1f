"""Helpers used only by the benchmarks: the quiet-machine gate and gated trial runs."""
