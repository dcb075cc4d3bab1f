"""A stock DeepSpeed ``PipelineModule`` with an explicit partition, for any ``LayerSpec`` list.

DeepSpeed partitions by parameters, uniformly or by layer type; ampe's plans give the exact layer boundaries of every
stage (``parts``), so :func:`explicit_pipeline_module` builds a pipeline whose stage j owns exactly
``parts[j] .. parts[j+1]-1``. :func:`local_layer_modules` maps global layer indices to the modules this stage built.
"""

from __future__ import annotations

from typing import Any

import torch
from deepspeed.pipe import PipelineModule
from torch import nn


def explicit_pipeline_module(specs: list[Any], parts: list[int], topology: Any, **kwargs: Any) -> Any:
    """A DeepSpeed ``PipelineModule`` whose stages own exactly ``parts[j]..parts[j+1]-1``.

    Stock DeepSpeed only partitions by parameters/uniform/type; the documented way in is to override
    ``_partition_layers``, set ``self.parts`` and call ``_set_bounds`` (without it the engine crashes)."""
    class ExplicitPartitionPipe(PipelineModule):
        def _partition_layers(self, method: str = "uniform") -> None:
            if len(parts) != self.num_stages + 1 or parts[0] != 0 or parts[-1] != len(self._layer_specs):
                raise ValueError(f"partition {parts} does not fit {self.num_stages} stages of "
                                 f"{len(self._layer_specs)} layers")
            self.parts = list(parts)
            stage = self._topo.get_coord(self.global_rank).pipe
            self._set_bounds(start=self.parts[stage], stop=self.parts[stage + 1])

        def forward(self, forward_input: Any) -> Any:
            if self.detach_input:  # the input crossed a frozen cut: no input gradient (ampe.runtime.freeze)
                forward_input = detach_inputs(forward_input)
            return super().forward(forward_input)

    pipe = ExplicitPartitionPipe(specs, topology=topology, **kwargs)
    pipe.detach_input = False
    return pipe


def model_specs(model: Any, tp: Any, dropout: float) -> list[Any]:
    """ampe's own layer specs of ``model`` (a :class:`~ampe.costmodel.model.Model` of the GPT or Llama family)
    sharded over the tensor-parallel group ``tp`` (GPT-2 blocks with ``dropout``; the Llama family has none)."""
    if model.family == "llama":
        from ampe.runtime.llama_pipe import layer_specs as llama_specs

        return llama_specs(model, tp)
    from ampe.runtime.gpt_pipe import layer_specs as gpt_specs

    return gpt_specs(model, tp, dropout)


def seed_kwargs(seed: int) -> dict[str, Any]:
    """``PipelineModule`` arguments that seed torch with ``seed + layer index`` before building each layer, so a
    layer's initial weights do not depend on which stage builds it (without them a stage starts drawing where its
    own seed leaves off, and pp 2 trains another model than pp 1)."""
    return {"seed_layers": True, "base_seed": seed}


def recompute_kwargs(mode: str) -> dict[str, Any]:
    """``PipelineModule`` arguments of a stage's activation recomputation ``mode``: ``full`` checkpoints every
    transformer block (``Block``: its input kept, its forward re-run in backward) with torch's non-reentrant
    checkpoint, which restores the dropout RNG as the cost model's one-block working set assumes; ``selective`` and
    ``none`` need none (selective is a flag on the blocks: :func:`set_selective`). The trial worker and the user API
    both build from this."""
    if mode != "full":
        return {}
    import functools

    from torch.utils.checkpoint import checkpoint

    return {"activation_checkpoint_interval": 1, "checkpointable_layers": ["Block"],
            "activation_checkpoint_func": functools.partial(checkpoint, use_reentrant=False)}


def set_selective(pipe: Any) -> int:
    """Make every ampe block of ``pipe`` re-run its core attention in backward (selective recomputation); returns
    how many blocks there were (0: user layers, which must checkpoint their attention themselves)."""
    blocks = [m for m in pipe.modules() if hasattr(m, "selective")]
    for m in blocks:
        m.selective = True
    return len(blocks)


def optimizer_in_use(engine: Any) -> str:
    """The torch optimizer a DeepSpeed engine steps (inside its bf16/fp16/ZeRO wrappers), as
    :func:`ampe.costmodel.training.optimizer_label` names a config's: e.g. ``torch.optim.AdamW(fused)``."""
    opt = engine.optimizer
    for _ in range(4):  # DeepSpeed's wrappers keep the torch optimizer as .optimizer
        inner = getattr(opt, "optimizer", None)
        if inner is None or inner is opt:
            break
        opt = inner
    cls = type(opt)
    name = f"torch.optim.{cls.__name__}" if cls.__module__.startswith("torch.optim") else \
        f"{cls.__module__}.{cls.__name__}"
    return f"{name}(fused)" if getattr(opt, "defaults", {}).get("fused") else name


def local_layer_modules(pipe: Any) -> dict[int, nn.Module]:
    """Global layer index → module for the layers this stage built (tied layers map to the shared tied module)."""
    out: dict[int, nn.Module] = {}
    start = pipe._local_start
    for offset, fn in enumerate(pipe.forward_funcs):
        module = getattr(fn, "args", (fn,))[0] if not isinstance(fn, nn.Module) else fn  # partial(lm_head, emb)
        out[start + offset] = module
    return out


def detach_inputs(inputs: Any) -> Any:
    """Inputs cut off from the previous stage's graph (a tensor or a tuple of them)."""
    if torch.is_tensor(inputs):
        return inputs.detach()
    if isinstance(inputs, tuple):
        return tuple(t.detach() if torch.is_tensor(t) else t for t in inputs)
    return inputs
