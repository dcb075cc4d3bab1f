"""The last stage's final output: the logits it keeps and the working set of the loss and the LM head's backward,
per tensor-parallel rank (bytes; docs/cost_model.md, "logits"). :mod:`ampe.costmodel.memory` adds them to the last
stage's peak; the per-layer memory probe (:mod:`ampe.profiling.memory_kinds`) checks them."""

from __future__ import annotations

from ampe.costmodel.model import Model, cut_sharded

LOSS_BYTES_PER_ELEM = 12.0  # fp32 log-softmax output (saved) + NLL's input gradient + log-softmax's input gradient
VOCAB_PARALLEL_LOSS_BYTES_PER_ELEM = 4.0  # the vocab-parallel loss's one fp32 copy (softmax, then the gradient)


def vocab_parallel(model: Model, tp: int) -> bool:
    """Whether the model's final output (the logits) is split by vocabulary over ``tp`` ranks, as ampe's runtime
    splits an LM head's at tp > 1."""
    return tp > 1 and cut_sharded(model, model.num_layers)


def logits_per_rank(model: Model, mbs: int, tp: int = 1) -> float:
    """Elements of the model's final output (the logits) one tensor-parallel rank holds for one micro-batch:
    ``mbs · s · V``, ÷ tp where it is vocab-parallel."""
    return mbs * model.layers[-1].out_elems / (tp if vocab_parallel(model, tp) else 1)


def head_backward_bytes(model: Model, mbs: int, tp: int = 1) -> float:
    """Bytes alive while the LM head's backward runs, for one micro-batch on one tensor-parallel rank, beyond the
    kept logits and the states: the logits' gradient (in their dtype), this micro-batch's weight gradient before it
    is added to the accumulated one (``V/tp · h``) and the input gradient (``mbs · s · h``). Measured on CPU: with
    the vocab-parallel loss at fp32 this, not the loss, sets the last stage's peak (llama-tiny at tp 2: the weight
    gradient is half the local logits). 0 for a model without an LM head layer."""
    i = model.logits_head
    if i is None:
        return 0.0
    b = model.bytes_per_elem
    weight = model.layers[i].params_per_rank(tp) * b
    return logits_per_rank(model, mbs, tp) * b + weight + mbs * model.layers[i - 1].out_elems * b


def loss_bytes(model: Model, mbs: int, tp: int = 1) -> float:
    """The working set of the loss and the LM head's backward at its peak, for one micro-batch on one
    tensor-parallel rank (bytes): the larger of the loss's (below) and :func:`head_backward_bytes`.

    tp = 1 (``F.cross_entropy(logits.float(), …)``): :data:`LOSS_BYTES_PER_ELEM` per logit of the ``mbs · s · V``
    logits. At the start of the log-softmax backward three fp32 tensors of the logits' size are alive: the
    log-softmax output (saved), the NLL's input gradient and the log-softmax's input gradient — 12 bytes per logit in
    any training precision (measured on CPU trials, docs/fidelity.md, and within 0.7 % on the H100's gpt2-medium at
    fp16, docs/gpu_check.md). The forward's fp32 upcast of 16-bit logits (4 bytes per logit: 2 GiB per sample for
    Llama 3's 128,256-word vocabulary at seq 4096) is alive only with the log-softmax output (8 bytes per logit, the
    forward's peak, below the backward's 12) and is freed before the backward: the autograd graph saves neither it
    nor anything of the cast.

    tp > 1 (the vocab-parallel loss, :func:`ampe.runtime.tensor_parallel.vocab_parallel_cross_entropy`): one fp32
    copy of this rank's ``mbs · s · V / tp`` logits, which becomes the softmax (saved) and then, in place, the
    gradient (:data:`VOCAB_PARALLEL_LOSS_BYTES_PER_ELEM`), plus at 16-bit the gradient cast back to the logits'
    precision while the fp32 one is still alive (2 more bytes per logit), plus per token the target's local index
    (int64, saved). Measured per layer kind by ``benchmarks/memory_probe.py`` (docs/cost_model.md): within 0.7 %
    (the rest is per-token temporaries of the backward, 0.5–4.5 bytes per token)."""
    n = logits_per_rank(model, mbs, tp)
    if not vocab_parallel(model, tp):
        loss = LOSS_BYTES_PER_ELEM * n
    else:
        cast = model.bytes_per_elem if model.bytes_per_elem < 4 else 0
        loss = (VOCAB_PARALLEL_LOSS_BYTES_PER_ELEM + cast) * n + 8.0 * mbs * model.seq_len
    return max(loss, head_backward_bytes(model, mbs, tp))


def kept_output_bytes(model: Model, mbs: int, slots: int, tp: int = 1) -> float:
    """The model's last output (the logits, in the training precision; this rank's vocabulary slice at tp > 1) kept
    in ``slots`` pipe buffer slots, bytes."""
    return slots * logits_per_rank(model, mbs, tp) * model.bytes_per_elem


def final_output_bytes(model: Model, mbs: int, slots: int, tp: int = 1) -> float:
    """What the last stage holds for its final output at its peak: the logits in ``slots`` pipe buffer slots
    (:func:`kept_output_bytes`) plus the loss's working set (:func:`loss_bytes`), on one tensor-parallel rank."""
    return kept_output_bytes(model, mbs, slots, tp) + loss_bytes(model, mbs, tp)
