"""ampe.trials: the trial runner's side of a real trial (the ``ampe trial`` process). No torch, no DeepSpeed.

Holds the runner (budget, timeouts, resume), launch command lines and hostfiles, process-group handling, outcome
classification, progress display, the results folder, the plan reader and the address-space limit shim that wraps
each rank. It starts workers as subprocesses and reads their files; it never imports :mod:`ampe.runtime`.

What it may import is docs/layout.md's table (checked by tests/test_layout.py).
"""
