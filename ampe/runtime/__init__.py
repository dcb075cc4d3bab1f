"""ampe.runtime: code that runs inside a training rank (torch and DeepSpeed).

Holds the trial worker, the explicit-partition ``PipelineModule``, the GPT pipe layers, Megatron-style tensor-parallel
layers, the frozen-prefix (FreezePipe) patches, the frequency-schedule hook, and the user API for running an exported
plan in one's own script (:mod:`ampe.runtime.user`: ``from ampe.runtime import load_export``). ``import ampe.runtime``
stays light: the user API is imported on first use, and torch only when a rank builds something.

What it may import is docs/layout.md's table (checked by tests/test_layout.py); never ampe.trials.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ExportedPlan", "MeasurementRecorder", "PlacementError", "load_export"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from ampe.runtime import user

        return getattr(user, name)
    raise AttributeError(f"module 'ampe.runtime' has no attribute {name!r}")
