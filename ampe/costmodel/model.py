"""Models as ordered layer lists: a built-in zoo (GPT-2, GPT-3, tiny CPU configs) and user YAML files.

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
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from ampe.costmodel.kernels import (
    Elementwise,
    Gemm,
    embedding_kernels,
    gpt_block_kernels,
    lm_head_kernels,
    norm_kernels,
)
from ampe.costmodel.spec_base import SpecModel
from ampe.errors import InputError, from_pydantic
from ampe.io import exists, read_yaml

BYTES_PER_ELEM = {"fp16": 2, "bf16": 2, "fp32": 4}
ATTENTIONS = ("eager", "flash")
KINDS = ("embedding", "transformer", "norm", "logits", "noop", "other")
MAX_LAYERS = 100_000  # one limit for every way to give a model: layer lists, ``base:``, Hugging Face configs
# The largest value each shape figure may take, whichever way the model is given (``base:`` overrides and Hugging Face
# configs alike; docs/reference/model_yaml.md)
SHAPE_LIMITS = {"layers": MAX_LAYERS, "hidden": 10**6, "heads": 10**4, "kv_heads": 10**4, "ffn": 10**7,
                "vocab": 10**8, "seq_len": 10**6, "head_dim": 10**5, "sliding_window": 10**7}
BUNDLED_MODELS = Path(__file__).resolve().parent.parent / "data" / "models"


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
    score_flops: float = 0.0  # forward FLOPs per sample of core attention (QKᵀ and ·V): selective recompute redoes them
    input_bytes: float = 0.0  # bytes per sample of the input, what full recomputation keeps (0: not checkpointed)
    # Backward working set, bytes per sample ÷ tp, alive on top of what the layer keeps while its backward runs
    # (measured on CPU with the allocation trace, docs/cost_model.md): the two widest gradients of the MLP
    # (2·s·f·bytes), and with eager attention the gradient of the s² scores (a·s·w·bytes; 0 with FlashAttention)
    bwd_work_bytes_sharded: float = 0.0
    score_grad_bytes_sharded: float = 0.0
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
        if recompute == "selective":
            return base
        return base + (self.score_bytes_sharded + mask_bytes * self.score_mask_elems_sharded) / tp

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
    # The shape the layers were built from (a zoo entry or a Hugging Face config): attention and precision variants
    # are rebuilt from it, and the trial worker builds the same network from it. None: a layer-list YAML.
    config: Any = None  # GptConfig | LlamaConfig | None (Any: llama.py imports this module)

    @property
    def num_layers(self) -> int:
        """Number of partitionable layers (DeepSpeed LayerSpec entries)."""
        return len(self.layers)

    @property
    def bytes_per_elem(self) -> int:
        """Bytes per activation/weight element in the training precision."""
        return BYTES_PER_ELEM[self.dtype]

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
                               bwd_work_bytes_sharded=l.bwd_work_bytes_sharded * f,
                               score_grad_bytes_sharded=l.score_grad_bytes_sharded * f)
                       for l in self.layers)
        return replace(self, layers=layers, dtype=dtype)

    def variant(self, attention: str | None = None, dtype: str | None = None) -> Model:
        """This model with ``attention`` and ``dtype`` where given (None: as it is): what a record of a run that
        used them is re-predicted with. ValueError for a variant that cannot be built."""
        model = self.with_dtype(dtype) if dtype is not None else self
        return model.with_attention(attention) if attention is not None else model

    def _rebuilt(self, attention: str, dtype: str) -> Model:
        """The same model from its config, with ``attention`` and ``dtype`` (name, source and frozen prefix kept)."""
        from ampe.costmodel.llama import LlamaConfig, llama_model

        cfg = replace(self.config, dtype=dtype)
        built = (llama_model(self.name, cfg, attention, self.source) if isinstance(cfg, LlamaConfig)
                 else gpt_model(self.name, cfg, attention, self.source))
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


# ---------------------------------------------------------------------------------------------------------------
# Zoo


@dataclass(frozen=True)
class GptConfig:
    """Shape of a GPT-style decoder."""

    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    dtype: str = "fp16"


def _transformer_act(s: int, h: int, a: int, b: int) -> tuple[float, float, float, float, float, float]:
    """Korthikanti et al. 2022 (no recompute, no sequence parallel), split into tensors and dropout masks.

    Per sample: kept elements 4·s·h (LayerNorm, attention and MLP inputs) + (12·s·h + 2·a·s²)/t (Q, K, V,
    projection input, MLP intermediate and GELU output, softmax and its dropout), plus dropout-mask elements
    2·s·h + a·s²/t. At 2-byte activations and 1-byte masks this is the paper's s·h·(10 + 24/t) + 5·a·s²/t bytes.
    Returns (fixed bytes, sharded bytes, fixed mask elements, sharded mask elements, sharded score bytes, sharded
    score mask elements); the last two are attention's s² part (softmax output and its dropout, the dropout mask),
    which FlashAttention and selective recomputation drop."""
    return 4 * s * h * b, 12 * s * h * b, 2 * s * h, 0, 2 * a * s * s * b, a * s * s


def gpt_model(name: str, cfg: GptConfig, attention: str = "eager", source: str = "zoo") -> Model:
    """Build the DeepSpeed pipe layer list (L + 6 entries) for a GPT decoder; ``attention`` as
    :meth:`Model.with_attention`."""
    s, h, a, v, b = cfg.seq_len, cfg.hidden, cfg.heads, cfg.vocab, BYTES_PER_ELEM[cfg.dtype]
    sh = s * h
    block_params = 12 * h * h + 13 * h
    block_flops = 24 * s * h * h + 4 * s * s * h
    fixed, sharded, mfixed, msharded, score, score_mask = _transformer_act(s, h, a, b)
    block_gemms, block_ew = gpt_block_kernels(s, h, a, b)
    embed_gemms, embed_ew = embedding_kernels(s, h, v, b, positions=True, dropout=True)
    head_gemms, head_ew = lm_head_kernels(s, h, v, b)
    layers: list[Layer] = [
        # keeps the token ids (int64) and the dropout mask of its output
        Layer("embed", "embedding", v * h + s * h, 0.0, sh, act_bytes_fixed=8 * s, mask_elems_fixed=sh,
              tied="embed", tied_params=v * h, tp_allreduces=1, tp_allreduce_elems=sh, tp_shardable=True,
              gemms=embed_gemms, elementwise=embed_ew),
        Layer("noop0", "noop", 0, 0.0, sh),
    ]
    for i in range(cfg.layers):
        layers.append(Layer(f"block{i}", "transformer", block_params, block_flops, sh, act_bytes_fixed=fixed,
                            act_bytes_sharded=sharded, mask_elems_fixed=mfixed, mask_elems_sharded=msharded,
                            tp_allreduces=2, tp_allreduce_elems=sh, tp_shardable=True,
                            score_bytes_sharded=score, score_mask_elems_sharded=score_mask,
                            score_flops=4.0 * s * s * h, input_bytes=sh * b,
                            bwd_work_bytes_sharded=2.0 * s * 4 * h * b, score_grad_bytes_sharded=float(a * s * s * b),
                            gemms=block_gemms, elementwise=block_ew))
    layers += [
        Layer("noop1", "noop", 0, 0.0, sh),
        Layer("final_norm", "norm", 2 * h, 5.0 * sh, sh, act_bytes_fixed=sh * b,
              elementwise=norm_kernels(s, h, b)[1]),
        Layer("logits", "logits", v * h, 2.0 * s * h * v, s * v, act_bytes_fixed=sh * b, tied="embed",
              tied_params=v * h, tp_shardable=True, gemms=head_gemms, elementwise=head_ew),
        Layer("noop2", "noop", 0, 0.0, s * v),
    ]
    model = Model(name, tuple(layers), seq_len=s, hidden=h, heads=a, vocab=v, dtype=cfg.dtype, source=source)
    model = model.with_attention(attention)  # no config yet: zeroes the score fields for flash
    return replace(model, config=cfg)


ZOO: dict[str, GptConfig] = {
    "gpt2": GptConfig(12, 768, 12, 50257, 1024),
    "gpt2-medium": GptConfig(24, 1024, 16, 50257, 1024),
    "gpt2-large": GptConfig(36, 1280, 20, 50257, 1024),
    "gpt2-xl": GptConfig(48, 1600, 25, 50257, 1024),
    # The AMP paper's GPT-2: 24 blocks, hidden 1024, 16 heads, vocab 52256, seq 1024 (30 DeepSpeed layer entries).
    "gpt2-amp": GptConfig(24, 1024, 16, 52256, 1024),
    # GPT-3 paper, Table 2.1.
    "gpt3-1.3b": GptConfig(24, 2048, 24, 50257, 2048),
    "gpt3-2.7b": GptConfig(32, 2560, 32, 50257, 2048),
    "gpt3-6.7b": GptConfig(32, 4096, 32, 50257, 2048),
    "gpt3-175b": GptConfig(96, 12288, 96, 50257, 2048),
    # Tiny configs that train in seconds on a CPU (fp32, the precision CPU trials run in).
    "gpt2-tiny": GptConfig(4, 128, 4, 2048, 128, dtype="fp32"),
    "gpt2-tiny-8": GptConfig(8, 256, 8, 4096, 128, dtype="fp32"),
}


def zoo_names() -> list[str]:
    """Built-in model names plus bundled YAML example models."""
    from ampe.costmodel.llama import LLAMA_ZOO

    bundled = sorted(p.stem for p in BUNDLED_MODELS.glob("*.yaml")) if BUNDLED_MODELS.is_dir() else []
    return sorted(ZOO) + sorted(LLAMA_ZOO) + bundled


def load_model(name_or_path: str, attention: str | None = None, dtype: str | None = None) -> Model:
    """A zoo model by name, a bundled example by name (e.g. ``transgan``), a user YAML file or a Hugging Face
    ``config.json`` by path. ``attention`` (``eager``/``flash``) overrides the model's default: eager for the GPT
    zoo and fp32 models, flash (SDPA) for 16-bit Llama-family models; ``dtype`` (fp32/bf16/fp16) overrides its
    training precision (:meth:`Model.variant`)."""
    from ampe.costmodel.llama import LLAMA_ZOO, llama_zoo_model

    if name_or_path in ZOO:
        model = gpt_model(name_or_path, ZOO[name_or_path])
    elif name_or_path in LLAMA_ZOO:
        model = llama_zoo_model(name_or_path)
    else:
        path = Path(name_or_path)
        bundled = BUNDLED_MODELS / f"{name_or_path}.yaml"
        if not exists(path) and exists(bundled):
            path = bundled
        if not exists(path):
            if path.suffix in (".yaml", ".yml", ".json") or "/" in name_or_path:
                raise InputError(name_or_path, "", "file not found")
            raise InputError("--model", "", f"unknown model {name_or_path!r}: not a file and not one of "
                             + ", ".join(zoo_names()))
        if path.suffix == ".json":
            from ampe.costmodel.hf_config import model_from_hf_config
            from ampe.io import read_json

            model = model_from_hf_config(read_json(path), str(path), attention)
        else:
            model = model_from_dict(read_yaml(path), str(path))
    try:
        return model.variant(attention, dtype)
    except ValueError as e:
        raise InputError("--attention" if attention is not None and "attention" in str(e) else "--dtype", "",
                         str(e)) from None


class _LayerSpec(SpecModel):
    # Bounds far above any real layer (GPT-3's largest is ~2e12 FLOPs per sample): beyond them the arithmetic of the
    # cost model overflows, so a typo is refused here instead.
    name: str | None = Field(default=None, max_length=256)
    kind: str = "other"
    params: int = Field(ge=0, le=10**15)
    fwd_flops: float = Field(ge=0, le=1e20)
    out_elems: int = Field(ge=1, le=10**13)
    act_bytes: float | None = Field(default=None, ge=0, le=1e15)
    tied: str | None = Field(default=None, max_length=256)
    tied_params: int | None = Field(default=None, ge=0, le=10**15)
    tp_allreduces: int | None = Field(default=None, ge=0, le=1000)
    tp_allreduce_elems: int | None = Field(default=None, ge=0, le=10**13)
    tp_shardable: bool | None = None
    repeat: int = Field(default=1, ge=1, le=100000)


class _ModelSpec(SpecModel):
    name: str = Field(min_length=1, max_length=256)
    dtype: str = "fp16"
    seq_len: int = Field(default=0, ge=0, le=10**7)
    hidden: int = Field(default=0, ge=0, le=10**7)
    heads: int = Field(default=0, ge=0, le=10**5)
    vocab: int = Field(default=0, ge=0, le=10**8)
    description: str | None = None
    layers: list[_LayerSpec] = Field(min_length=1)


# What a model YAML with ``base:`` may change of its zoo model's shape (GptConfig / LlamaConfig fields)
BASE_OVERRIDES = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len", "head_dim", "sliding_window")


class _BasedSpec(SpecModel):
    name: str | None = Field(default=None, min_length=1, max_length=256)
    base: str = Field(min_length=1, max_length=256)
    dtype: str | None = None
    description: str | None = None
    layers: int | None = Field(default=None, ge=1, le=SHAPE_LIMITS["layers"])
    hidden: int | None = Field(default=None, ge=1, le=SHAPE_LIMITS["hidden"])
    heads: int | None = Field(default=None, ge=1, le=SHAPE_LIMITS["heads"])
    kv_heads: int | None = Field(default=None, ge=1, le=SHAPE_LIMITS["kv_heads"])
    ffn: int | None = Field(default=None, ge=1, le=SHAPE_LIMITS["ffn"])
    vocab: int | None = Field(default=None, ge=1, le=SHAPE_LIMITS["vocab"])
    seq_len: int | None = Field(default=None, ge=1, le=SHAPE_LIMITS["seq_len"])
    head_dim: int | None = Field(default=None, ge=1, le=SHAPE_LIMITS["head_dim"])
    sliding_window: int | None = Field(default=None, ge=0, le=SHAPE_LIMITS["sliding_window"])


def model_from_base(raw: dict[str, Any], source: str) -> Model:
    """A zoo model (``base:``) with some of its shape changed, e.g. ``{base: llama-3.2-1b, seq_len: 1024}``: built
    from the changed config, so the trial worker and the profiler build it too. ``name`` defaults to the file's."""
    from ampe.costmodel.llama import LLAMA_ZOO, LlamaConfig, default_attention, llama_model

    try:
        spec = _BasedSpec.model_validate(raw)
    except ValidationError as e:
        raise from_pydantic(source, e) from None
    cfg: GptConfig | LlamaConfig
    if spec.base in ZOO:
        cfg = ZOO[spec.base]
    elif spec.base in LLAMA_ZOO:
        cfg = LLAMA_ZOO[spec.base]
    else:
        raise InputError(source, "base", f"unknown zoo model {spec.base!r} (one of {', '.join(sorted(ZOO))}, "
                         f"{', '.join(sorted(LLAMA_ZOO))})")
    changes = {k: getattr(spec, k) for k in BASE_OVERRIDES if getattr(spec, k) is not None}
    if spec.dtype is not None:
        if spec.dtype not in BYTES_PER_ELEM:
            raise InputError(source, "dtype", f"must be one of {', '.join(BYTES_PER_ELEM)}, got {spec.dtype!r}")
        changes["dtype"] = spec.dtype
    known = set(cfg.__dataclass_fields__)
    for key in changes:
        if key not in known:
            raise InputError(source, key, f"{spec.base} is a {type(cfg).__name__}: it has no {key!r}")
    cfg = replace(cfg, **changes)
    heads, hidden = cfg.heads, cfg.hidden
    if not (isinstance(cfg, LlamaConfig) and cfg.head_dim) and hidden % heads:
        raise InputError(source, "heads", f"{heads} does not divide hidden {hidden}")
    if isinstance(cfg, LlamaConfig):
        if heads % cfg.kv_heads:
            raise InputError(source, "kv_heads", f"{cfg.kv_heads} does not divide heads {heads}")
        if cfg.head_size % 2:  # rotary embeddings rotate pairs of dimensions
            raise InputError(source, "head_dim" if cfg.head_dim else "heads",
                             f"the head dimension {cfg.head_size} must be even (rotary embeddings)")
    name = spec.name or Path(source).stem
    if isinstance(cfg, LlamaConfig):
        return llama_model(name, cfg, default_attention(cfg.dtype), source=source)
    return gpt_model(name, cfg, "eager", source)


def _check_tied(spec: _ModelSpec, source: str) -> None:
    """Layers tied to one weight hold the same tensor: every member of a ``tied`` group must name the same number
    of tied parameters (``tied_params``, default all of its ``params``)."""
    first: dict[str, tuple[int, int]] = {}
    for i, ls in enumerate(spec.layers):
        if not ls.tied:
            continue
        n = ls.tied_params if ls.tied_params is not None else ls.params
        j, m = first.setdefault(ls.tied, (i, n))
        if m != n:
            raise InputError(source, f"layers[{i}].tied_params", f"{n} tied parameters, but layers[{j}] of the "
                             f"same tied group {ls.tied!r} has {m}; tied layers share one weight")


def model_from_dict(raw: Any, source: str = "<model>") -> Model:
    """Validate a parsed model YAML: a layer list, or a zoo model with its shape changed (``base:``). Defaults for
    optional per-layer keys are in docs/reference/model_yaml.md."""
    if not isinstance(raw, dict):
        raise InputError(source, "(root)", "a model file must be a mapping with `name` and `layers`")
    if "base" in raw:
        return model_from_base(raw, source)
    try:
        spec = _ModelSpec.model_validate(raw)
    except ValidationError as e:
        raise from_pydantic(source, e) from None
    if spec.dtype not in BYTES_PER_ELEM:
        raise InputError(source, "dtype", f"must be one of {', '.join(BYTES_PER_ELEM)}, got {spec.dtype!r}")
    if sum(ls.repeat for ls in spec.layers) > MAX_LAYERS:
        raise InputError(source, "layers", f"more than {MAX_LAYERS} layers")
    if spec.heads and spec.hidden and spec.hidden % spec.heads:
        raise InputError(source, "heads", f"{spec.heads} does not divide hidden {spec.hidden}")
    _check_tied(spec, source)
    b = BYTES_PER_ELEM[spec.dtype]
    layers: list[Layer] = []
    for i, ls in enumerate(spec.layers):
        if ls.kind not in KINDS:
            raise InputError(source, f"layers[{i}].kind", f"must be one of {', '.join(KINDS)}, got {ls.kind!r}")
        if ls.tied_params is not None and ls.tied_params > ls.params:
            raise InputError(source, f"layers[{i}].tied_params", "exceeds the layer's params")
        is_tf = ls.kind == "transformer"
        shardable = ls.tp_shardable if ls.tp_shardable is not None else ls.kind in ("transformer", "embedding",
                                                                                      "logits")
        # Default activation memory: a transformer block keeps about 17 output-sized tensors (34·s·h bytes at fp16,
        # Korthikanti et al.), 24/34 of it split by tp; any other layer keeps its output.
        act = ls.act_bytes if ls.act_bytes is not None else (17 * ls.out_elems * b if is_tf else ls.out_elems * b)
        sharded = act * 24 / 34 if (is_tf and shardable) else 0.0
        for r in range(ls.repeat):
            name = ls.name or f"{ls.kind}{len(layers)}"
            if ls.repeat > 1:
                name = f"{name}.{r}"
            layers.append(Layer(
                name=name, kind=ls.kind, params=ls.params, fwd_flops=ls.fwd_flops, out_elems=ls.out_elems,
                act_bytes_fixed=act - sharded, act_bytes_sharded=sharded, tied=ls.tied,
                tied_params=(ls.tied_params if ls.tied_params is not None else (ls.params if ls.tied else 0)),
                tp_allreduces=ls.tp_allreduces if ls.tp_allreduces is not None else (2 if is_tf else 0),
                tp_allreduce_elems=ls.tp_allreduce_elems if ls.tp_allreduce_elems is not None else ls.out_elems,
                tp_shardable=shardable,
            ))
    for key in ("seq_len", "hidden"):
        if not math.isfinite(getattr(spec, key)):
            raise InputError(source, key, "must be finite")
    return Model(spec.name, tuple(layers), seq_len=spec.seq_len, hidden=spec.hidden, heads=spec.heads,
                 vocab=spec.vocab, dtype=spec.dtype, source=source)
