"""ampe.runtime: code that runs inside a training rank (torch and DeepSpeed imported at module top level).

Holds the trial worker, the explicit-partition ``PipelineModule``, the GPT pipe layers, Megatron-style tensor-parallel
layers, the frozen-prefix (FreezePipe) patches and the frequency-schedule hook. This package's ``__init__`` imports
nothing, so ``import ampe.runtime`` stays light; its modules do import torch.

May import: ampe.measure, ampe.costmodel (the model description), ampe.errors, ampe.io. Never ampe.trials.
"""
