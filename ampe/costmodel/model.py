"""Models as ordered layer lists: :class:`Layer` and :class:`Model` (the families that build them are
:mod:`ampe.costmodel.gpt` and :mod:`ampe.costmodel.llama`; loading by name or file is :mod:`ampe.costmodel.zoo`).

A layer here is one DeepSpeed ``LayerSpec`` entry, so partition boundaries such as ``[0, 7, 14, 20, 30]`` mean the same
thing to the cost model, the search and the trial worker. GPT models use the Megatron/DeepSpeed pipe layout of
L + 6 entries::

    0 embedding (tied "embed") | 1 noop | 2..L+1 transformer | L+2 noop | L+3 norm
    | L+4 logits (tied "embed") | L+5 noop

which for the AMP GPT-2 (L = 24) is exactly AMP's 30 entries ``[embed2h, noop, 24×transformer, noop, noop, embed2v,
noop]``. Per-layer figures are *per sample* at tensor-parallel degree 1; see ``docs/reference/model_yaml.md``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from ampe.costmodel.kernels import Elementwise, Gemm

BYTES_PER_ELEM = {"fp16": 2, "bf16": 2, "fp32": 4}
ATTENTIONS = ("eager", "flash")
MAX_LAYERS = 100_000  # one limit for every way to give a model: layer lists, ``base:``, Hugging Face configs
# The largest value each shape figure may take, whichever way the model is given (``base:`` overrides and Hugging Face
# configs alike; docs/reference/model_yaml.md)
SHAPE_LIMITS = {"layers": MAX_LAYERS, "hidden": 10**6, "heads": 10**4, "kv_heads": 10**4, "ffn": 10**7,
                "vocab": 10**8, "seq_len": 10**6, "head_dim": 10**5, "sliding_window": 10**7}


@dataclass(frozen=True)
class Layer:
    """One pipeline-partitionable layer. Counts are per sample, at tensor-parallel degree 1."""

    name: str
    kind: str
    params: int  # parameters this layer holds when placed on a stage (tied copies included)
    fwd_flops: float  # forward FLOPs per sample
    out_elems: int  # elements of the output activation per sample (what a pipeline cut sends)
    act_bytes_fixed: float = 0.0  # activation bytes kept for backward per sample, not split by tensor parallelism
    act_bytes_sharded: float = 0.0  # activation bytes kept for backward per sample, divided by tp
    mask_elems_fixed: float = 0.0  # dropout-mask elements kept per sample (bytes per element depend on the device)
    mask_elems_sharded: float = 0.0  # dropout-mask elements per sample divided by tp
    tied: str | None = None  # tied-weight group name (e.g. the GPT input embedding and the LM head)
    tied_params: int = 0  # how many of `params` are the tied weight
    tp_allreduces: int = 0  # Megatron all-reduces per forward pass when tp > 1 (the same number again in backward)
    tp_allreduce_elems: int = 0  # elements per sample of each such all-reduce
    tp_shardable: bool = False  # whether params and FLOPs split over tensor-parallel ranks
    frozen: bool = False  # frozen layers run forward only: no backward, no gradients, no optimizer state
    # A frozen layer whose tied weight keeps training through another, unfrozen member of its group (the GPT input
    # embedding while the LM head trains): it still runs forward only, but DeepSpeed keeps the weight trainable on
    # every stage holding it — gradient (zero from this layer), optimizer state, tied all-reduce, optimizer step.
    tied_trainable: bool = False
    # Attention's s² part (eager attention only; FlashAttention keeps none of it): the scores/softmax/dropout
    # bytes and dropout-mask elements per sample, divided by tp — what selective recomputation drops
    score_bytes_sharded: float = 0.0
    score_mask_elems_sharded: float = 0.0
    # Grouped-query K and V as one copy per K/V head keeps them (FlashAttention's saved inputs, or what selective
    # recomputation saves), bytes per sample at tp = 1: a rank holds its K/V heads, ÷ min(tp, kv_heads) (replicated
    # where there are fewer K/V heads than ranks). Eager attention without recomputation keeps per-query-head copies
    # of them instead, counted in score_bytes_sharded.
    kv_bytes: float = 0.0
    kv_heads: int = 0
    score_flops: float = 0.0  # forward FLOPs per sample of core attention (QKᵀ and ·V): selective recompute redoes them
    input_bytes: float = 0.0  # bytes per sample of the input, what full recomputation keeps (0: not checkpointed)
    # Backward working set, bytes per sample ÷ tp, alive on top of what the layer keeps while its backward runs
    # (measured on CPU with the allocation trace, docs/cost_model.md): the two widest gradients of the MLP
    # (2·s·f·bytes), and with eager attention the gradient of the s² scores (a·s·w·bytes; 0 with FlashAttention)
    bwd_work_bytes_sharded: float = 0.0
    score_grad_bytes_sharded: float = 0.0
    # Module buffers the layer keeps on its device, bytes per tp rank, whatever the batch (not parameters: nothing
    # trains them): the runtime's rotary tables (fp32: DeepSpeed casts parameters, not buffers) and eager
    # attention's s² causal mask (bool)
    buffer_bytes: float = 0.0
    # The forward's kernels per sample at tp = 1 (ampe.costmodel.kernels), what the roofline times: matrix products
    # with their shapes, and memory-bound passes. Neither (a model YAML): the roofline treats the layer as one kernel
    # of fwd_flops FLOPs moving its activation bytes and weights (docs/cost_model.md).
    gemms: tuple[Gemm, ...] = ()
    elementwise: tuple[Elementwise, ...] = ()

    def act_bytes(self, tp: int = 1, mask_bytes: int = 1, recompute: str = "none") -> float:
        """Activation bytes kept for backward, per sample, on one tensor-parallel rank; dropout masks take
        ``mask_bytes`` per element (1 on CUDA, 4 with PyTorch's CPU dropout). ``recompute``: ``none``;
        ``selective`` drops attention's s² scores (Korthikanti et al. 2022); ``full`` keeps only the input of a
        checkpointed layer (one with ``input_bytes``)."""
        if recompute == "full" and self.input_bytes > 0:
            return self.input_bytes
        base = (self.act_bytes_fixed + self.act_bytes_sharded / tp
                + mask_bytes * (self.mask_elems_fixed + self.mask_elems_sharded / tp))
        kv = self.kv_bytes / min(tp, self.kv_heads) if self.kv_bytes else 0.0
        scores = (self.score_bytes_sharded + mask_bytes * self.score_mask_elems_sharded) / tp
        if recompute == "selective" or not scores:
            return base + kv
        return base + scores

    @property
    def checkpointed(self) -> bool:
        """Whether full recomputation checkpoints this layer (transformer blocks: DeepSpeed's
        ``checkpointable_layers``)."""
        return self.input_bytes > 0

    def params_per_rank(self, tp: int = 1) -> float:
        """Parameters held by one tensor-parallel rank."""
        return self.params / tp if self.tp_shardable else float(self.params)

    @property
    def trains_tied(self) -> bool:
        """Whether this layer's tied weight (if any) is trained, here or through another member of its group."""
        return not self.frozen or self.tied_trainable

    def trainable_params_per_rank(self, tp: int = 1) -> float:
        """Parameters one tensor-parallel rank trains for this layer (gradients, optimizer state, all-reduce)."""
        if not self.frozen:
            return self.params_per_rank(tp)
        if self.tied_trainable:
            return self.tied_params / tp if self.tp_shardable else float(self.tied_params)
        return 0.0


@dataclass(frozen=True)
class Model:
    """An ordered list of layers plus the shape figures that analytic formulas need."""

    name: str
    layers: tuple[Layer, ...]
    seq_len: int = 0
    hidden: int = 0
    heads: int = 0
    vocab: int = 0
    dtype: str = "fp16"
    source: str = "zoo"
    attention: str = "eager"  # "eager" (scores materialised) or "flash" (FlashAttention / SDPA: no s² memory)
    family: str = "gpt"  # "gpt" (GPT-2/3 layers) or "llama" (RMSNorm, SwiGLU, GQA, rotary)
    # fp32 matrix products may run as TF32 (torch.backends.cuda.matmul.allow_tf32 and cudnn's; PyTorch's default is
    # False): the roofline then prices them at the GPU's TF32 tensor-core rate. Nothing else in a 16-bit model.
    tf32: bool = False
    # The shape the layers were built from (a zoo entry or a Hugging Face config): attention and precision variants
    # are rebuilt from it, and the trial worker builds the same network from it. None: a layer-list YAML.
    # GptConfig | LlamaConfig | None: a frozen dataclass with ``dtype`` and ``build(name, attention, source)``, which
    # builds the model of that shape (typed Any: the family modules import this one, and callers read their fields)
    config: Any = None

    @property
    def num_layers(self) -> int:
        """Number of partitionable layers (DeepSpeed LayerSpec entries)."""
        return len(self.layers)

    @property
    def bytes_per_elem(self) -> int:
        """Bytes per activation/weight element in the training precision."""
        return BYTES_PER_ELEM[self.dtype]

    @cached_property
    def logits_head(self) -> int | None:
        """Index of the last LM-head layer (kind ``logits``), None without one (kept: the memory bounds ask for it
        per stage of every candidate)."""
        heads = [i for i, layer in enumerate(self.layers) if layer.kind == "logits"]
        return heads[-1] if heads else None

    @property
    def gemm_precision(self) -> str:
        """The precision its matrix products run in: ``tf32`` for an fp32 model with TF32 allowed, else ``dtype``."""
        return "tf32" if self.tf32 and self.dtype == "fp32" else self.dtype

    def unique_params(self) -> int:
        """Total trainable parameters with every tied group counted once."""
        total = sum(l.params for l in self.layers)
        seen: dict[str, int] = {}
        for l in self.layers:
            if l.tied:
                if l.tied in seen:
                    total -= min(l.tied_params, seen[l.tied])
                else:
                    seen[l.tied] = l.tied_params
        return total

    def tied_duplicates(self, layers: range) -> list[tuple[int, int]]:
        """(layer index, tied params) of tied layers in ``layers`` whose weight an earlier layer of the same range
        already holds: on one stage a tied weight is a single tensor, so these copies cost nothing."""
        seen: set[str] = set()
        dups = []
        for i in layers:
            l = self.layers[i]
            if l.tied:
                if l.tied in seen:
                    dups.append((i, l.tied_params))
                seen.add(l.tied)
        return dups

    def stage_params(self, layers: range, tp: int = 1, trainable_only: bool = False) -> float:
        """Parameters one tensor-parallel rank holds for ``layers`` (tied weights counted once per stage)."""
        total = sum(self.layers[i].trainable_params_per_rank(tp) if trainable_only
                    else self.layers[i].params_per_rank(tp) for i in layers)
        for i, n in self.tied_duplicates(layers):
            if not (trainable_only and not self.layers[i].trains_tied):
                total -= n / tp if self.layers[i].tp_shardable else n
        return total

    def with_attention(self, attention: str) -> Model:
        """A copy with ``attention`` = ``eager`` (scores and softmax kept for backward: s² memory) or ``flash``
        (FlashAttention or torch SDPA's memory-efficient kernel: no s² score memory; its backward recomputes the
        scores, counted in the roofline as the score FLOPs again). Either way round for a model built from a
        config (zoo, Hugging Face); a layer-list YAML (eager) can only become flash."""
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, got {attention!r}")
        if attention == self.attention:
            return self
        if self.config is not None:
            return self._rebuilt(attention, self.dtype)
        if attention == "eager":
            raise ValueError(f"{self.name} was built with FlashAttention and has no config to rebuild it from")
        layers = tuple(replace(l, score_bytes_sharded=0.0, score_mask_elems_sharded=0.0, score_grad_bytes_sharded=0.0)
                       for l in self.layers)
        return replace(self, layers=layers, attention=attention)

    def with_dtype(self, dtype: str) -> Model:
        """A copy trained in ``dtype`` (fp32, bf16, fp16): weights, activations and peak FLOP/s follow it. A model
        built from a config is rebuilt; a layer-list YAML has its activation bytes scaled by the element size
        (its token ids, 8 bytes each, scale too: an approximation of a few bytes per sample)."""
        if dtype not in BYTES_PER_ELEM:
            raise ValueError(f"dtype must be one of {', '.join(BYTES_PER_ELEM)}, got {dtype!r}")
        if dtype == self.dtype:
            return self
        if self.config is not None:
            return self._rebuilt(self.attention, dtype)
        f = BYTES_PER_ELEM[dtype] / BYTES_PER_ELEM[self.dtype]
        layers = tuple(replace(l, act_bytes_fixed=l.act_bytes_fixed * f, act_bytes_sharded=l.act_bytes_sharded * f,
                               score_bytes_sharded=l.score_bytes_sharded * f, input_bytes=l.input_bytes * f,
                               kv_bytes=l.kv_bytes * f,
                               bwd_work_bytes_sharded=l.bwd_work_bytes_sharded * f,
                               score_grad_bytes_sharded=l.score_grad_bytes_sharded * f)
                       for l in self.layers)
        return replace(self, layers=layers, dtype=dtype)

    def with_tf32(self, tf32: bool) -> Model:
        """A copy whose fp32 matrix products may run as TF32 (``tf32``) or may not."""
        return self if tf32 == self.tf32 else replace(self, tf32=tf32)

    def variant(self, attention: str | None = None, dtype: str | None = None, tf32: bool | None = None) -> Model:
        """This model with ``attention``, ``dtype`` and ``tf32`` where given (None: as it is): what a record of a
        run that used them is re-predicted with. ValueError for a variant that cannot be built."""
        model = self.with_dtype(dtype) if dtype is not None else self
        model = model.with_tf32(tf32) if tf32 is not None else model
        return model.with_attention(attention) if attention is not None else model

    def _rebuilt(self, attention: str, dtype: str) -> Model:
        """The same model from its config, with ``attention`` and ``dtype`` (name, source and frozen prefix kept)."""
        built = replace(self.config, dtype=dtype).build(self.name, attention, self.source).with_tf32(self.tf32)
        frozen = sum(1 for _ in itertools.takewhile(lambda l: l.frozen, self.layers))
        return built.with_frozen_prefix(frozen) if frozen else built

    def with_frozen_prefix(self, n: int) -> Model:
        """A copy whose first ``n`` layers are frozen (forward only; FreezePipe). A frozen layer whose tied group has
        a member outside the prefix keeps its tied weight trainable (``tied_trainable``), as DeepSpeed does."""
        if not 0 <= n <= self.num_layers:
            raise ValueError(f"frozen prefix {n} outside 0..{self.num_layers}")
        trained_groups = {l.tied for i, l in enumerate(self.layers) if l.tied and i >= n}
        layers = tuple(replace(l, frozen=i < n, tied_trainable=i < n and l.tied in trained_groups)
                       for i, l in enumerate(self.layers))
        return replace(self, layers=layers)


def cut_sharded(model: Model, cut: int) -> bool:
    """Whether the activation crossing a cut before layer ``cut`` is split over tensor-parallel ranks: Megatron keeps
    activations replicated across tp ranks except the vocab-parallel logits (and a no-op right after them)."""
    prev = model.layers[cut - 1]
    return prev.kind == "logits" or (cut >= 2 and prev.kind == "noop" and model.layers[cut - 2].kind == "logits")
