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
