"""A frozen layer prefix (FreezePipe) that really runs forward only on stock DeepSpeed.

ampe's cost model treats the first ``frozen_layers`` layers as forward only: no backward, no gradients, no optimizer
state, no activations kept, and no gradient sent back across a cut with only frozen layers before it. Setting
``requires_grad=False`` is not enough to get that from DeepSpeed's pipeline engine:

* GPT ties the input embedding to the LM head. While the LM head trains, the tied weight must stay trainable on every
  stage holding it (DeepSpeed all-reduces its gradient between the copies and steps each copy), so layer 0's output
  would require grad and every frozen block after it would keep activations and run the input-gradient backward.
  :func:`freeze_prefix` therefore marks the frozen input embedding's lookup as *detached*
  (:attr:`~ampe.runtime.tensor_parallel.VocabParallelEmbedding.frozen_lookup`): the tied weight still trains through
  the LM head, the lookup no longer contributes a gradient, and nothing in the prefix needs autograd.
* DeepSpeed's schedule still issues BackwardPass/RecvGrad on stages whose output has no graph, and
  RecvActivation marks every received activation as requiring grad, so the first trainable stage would compute and
  SendGrad an input gradient nobody needs. :func:`install` replaces, on this engine instance only, the instructions
  of a frozen cut on *both* sides (SendGrad on the receiver, RecvGrad on the sender: the pairing stays consistent)
  with no-ops that only free DeepSpeed's buffers, makes the backward of an all-frozen stage a no-op, and detaches
  the input of a stage that follows a frozen cut.
* A stage copy of a tied weight that got no gradient (its lookup is detached) gets a zero gradient before DeepSpeed's
  tied all-reduce, which would otherwise skip it on one side and hang; the copies then step on the same summed
  gradient and stay identical.
* A stage with no trainable parameter at all (possible for middle stages) gets a one-element placeholder parameter
  (:func:`placeholder_parameter`) because DeepSpeed refuses an empty optimizer; it receives zero gradients.

Cuts are decided statically from the partition (``frozen_layers >= cut``), so both sides of a cut agree without
communicating.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from deepspeed.runtime.pipe import schedule

from ampe.runtime.pipeline import local_layer_modules
from ampe.runtime.tensor_parallel import VocabParallelEmbedding

PLACEHOLDER = "ampe_frozen_stage_placeholder"


@dataclass(frozen=True)
class FrozenCuts:
    """What the frozen prefix means for one pipeline stage holding layers ``partition[stage]..partition[stage+1]-1``."""
    input_frozen: bool  # the stage's input comes across a cut with only frozen layers before it (never stage 0)
    output_frozen: bool  # every layer up to the stage's end is frozen: its output has no graph (never the last stage)

    @classmethod
    def of(cls, partition: Sequence[int], stage: int, frozen_layers: int) -> FrozenCuts:
        """The cuts of ``stage`` for a prefix of ``frozen_layers`` frozen layers."""
        last = len(partition) - 2
        return cls(input_frozen=stage > 0 and frozen_layers >= partition[stage],
                   output_frozen=stage < last and frozen_layers >= partition[stage + 1])


def freeze_prefix(pipe: Any, frozen_layers: int, model: Any) -> dict[str, int]:
    """``requires_grad=False`` for the parameters of layers ``< frozen_layers`` on this stage.

    A tied weight stays trainable while any layer of its tied group is outside the prefix (the LM head still trains
    the word embedding, and DeepSpeed keeps the copies identical by all-reducing their gradients); a frozen layer
    holding it then looks it up *detached*, so it runs forward only. Returns parameter counts."""
    layers = model.layers
    groups: dict[str, list[int]] = {}
    for i, l in enumerate(layers):
        if l.tied:
            groups.setdefault(l.tied, []).append(i)
    tied_trainable = {k for k, idx in groups.items() if any(i >= frozen_layers for i in idx)}
    keep = set()
    for key in tied_trainable:
        if key in pipe.tied_modules:
            for attr in pipe.tied_weight_attrs[key]:
                keep.add(id(pipe._recursive_getattr(pipe.tied_modules[key], attr)))
    frozen = detached = 0
    for idx, module in local_layer_modules(pipe).items():
        if idx >= frozen_layers:
            continue
        for p in module.parameters():
            if id(p) not in keep and p.requires_grad:
                p.requires_grad_(False)
                frozen += p.numel()
        if layers[idx].kind == "embedding":  # the lookup of a frozen input embedding (not the LM head's matmul)
            for sub in module.modules():
                if isinstance(sub, VocabParallelEmbedding) and id(sub.weight) in keep:
                    sub.frozen_lookup = True
                    detached += sub.weight.numel()
    trainable = sum(p.numel() for p in pipe.parameters() if p.requires_grad)
    return {"frozen_params": frozen, "trainable_params": trainable, "detached_tied_params": detached}


def placeholder_parameter(pipe: Any) -> Any:
    """Register and return a one-element trainable parameter on a stage with none (stock DeepSpeed refuses an
    empty optimizer). It takes no part in the forward pass; DeepSpeed gives it zero gradients."""
    p = torch.nn.Parameter(torch.zeros(1))
    pipe.register_parameter(PLACEHOLDER, p)
    return p


def install(engine: Any, cuts: FrozenCuts) -> list[str]:
    """Patch this engine instance's instruction map for the stage's frozen cuts (see the module docstring). Returns
    the names of the instructions replaced (for the rank report)."""
    table = dict(engine._INSTRUCTION_MAP)
    changed: list[str] = []
    if cuts.input_frozen:
        engine.module.detach_input = True
        table[schedule.SendGrad] = _skip_send_grads
        changed.append("SendGrad")
    if cuts.output_frozen:
        table[schedule.BackwardPass] = _frozen_backward
        table[schedule.RecvGrad] = _skip_recv_grads
        changed += ["BackwardPass", "RecvGrad"]
    reduce_tied = table[schedule.ReduceTiedGrads]

    def reduce_tied_grads(eng: Any, **kw: Any) -> Any:
        _zero_missing_tied_grads(eng)
        return reduce_tied(eng, **kw)

    table[schedule.ReduceTiedGrads] = reduce_tied_grads
    engine._INSTRUCTION_MAP = table
    return changed


def _skip_send_grads(engine: Any, buffer_id: int) -> None:
    """No input gradient exists across a frozen cut: free the input buffer as DeepSpeed's SendGrad would."""
    engine.pipe_buffers["inputs"][buffer_id] = None


def _skip_recv_grads(engine: Any, buffer_id: int) -> None:
    """The next stage sends no gradient across a frozen cut."""


def _frozen_backward(engine: Any, buffer_id: int) -> None:
    """Nothing before this stage's output trains: free the forward's buffers as DeepSpeed's BackwardPass would."""
    engine.pipe_buffers["output_tensors"][buffer_id] = None
    engine.pipe_buffers["outputs"][buffer_id] = None


def _zero_missing_tied_grads(engine: Any) -> None:
    for weight, _ in engine.module.get_tied_weights_and_groups():
        if not weight.requires_grad:
            continue
        if getattr(engine, "using_bf16_optimizer", False):
            continue  # the bf16 optimizer keeps a flat fp32 gradient buffer for every trainable weight
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
