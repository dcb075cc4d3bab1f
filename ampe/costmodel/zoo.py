"""Loading a model by name or file: the built-in zoo (GPT and Llama families), bundled examples, user YAML files
(a layer list, or a zoo model with its shape changed) and Hugging Face ``config.json`` files."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from ampe.costmodel.gpt import ZOO, GptConfig, gpt_model
from ampe.costmodel.hf_config import context_cut as hf_context_cut
from ampe.costmodel.hf_config import model_from_hf_config
from ampe.costmodel.llama import LLAMA_ZOO, LlamaConfig, default_attention, llama_model, llama_zoo_model
from ampe.costmodel.model import BYTES_PER_ELEM, MAX_LAYERS, SHAPE_LIMITS, Layer, Model
from ampe.costmodel.spec_base import PrintableName, SpecModel
from ampe.errors import InputError, from_pydantic, suggest
from ampe.io import exists, read_json, read_yaml

KINDS = ("embedding", "transformer", "norm", "logits", "noop", "other")
BUNDLED_MODELS = Path(__file__).resolve().parent.parent / "data" / "models"


def zoo_names() -> list[str]:
    """Built-in model names plus bundled YAML example models."""
    bundled = sorted(p.stem for p in BUNDLED_MODELS.glob("*.yaml")) if BUNDLED_MODELS.is_dir() else []
    return sorted(ZOO) + sorted(LLAMA_ZOO) + bundled


def load_model(name_or_path: str, attention: str | None = None, dtype: str | None = None,
               seq_len: int | None = None, seq_len_from: tuple[str, str] = ("--seq-len", "")) -> Model:
    """A zoo model by name, a bundled example by name (e.g. ``transgan``), a user YAML file or a Hugging Face
    ``config.json`` by path. ``attention`` (``eager``/``flash``) overrides the model's default: eager for the GPT
    zoo and fp32 models, flash (SDPA) for 16-bit Llama-family models; ``dtype`` (fp32/bf16/fp16) overrides its
    training precision (:meth:`Model.variant`); ``seq_len`` (tokens, ``--seq-len``) the sequence length of a Hugging
    Face config (up to its context); another model must already have it (a model YAML with ``base:`` and
    ``seq_len:`` changes a zoo model's). ``seq_len_from``: (file, field) an error about ``seq_len`` names (a plan's
    ``inputs.seq_len``; default the flag)."""
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
            close = suggest(name_or_path, zoo_names())
            raise InputError("--model", "", f"unknown model {name_or_path!r}"
                             + (f" (did you mean {close}?)" if close else "") + ": not a file and not one of "
                             + ", ".join(zoo_names()))
        if path.suffix == ".json":
            try:
                model = model_from_hf_config(read_json(path), str(path), attention, seq_len)
            except InputError as e:
                if e.source != "--seq-len":
                    raise
                raise InputError(*seq_len_from, e.message) from None
        else:
            model = model_from_dict(read_yaml(path), str(path))
    if seq_len is not None and seq_len != model.seq_len and not name_or_path.endswith(".json"):
        raise InputError(*seq_len_from, f"{model.name} is planned at its own seq_len {model.seq_len}: --seq-len "
                         "applies to a Hugging Face config.json; for a zoo model write a model YAML with `base: "
                         f"{model.name}` and `seq_len: {seq_len}` (docs/reference/model_yaml.md)")
    try:
        return model.variant(attention, dtype)
    except ValueError as e:
        raise InputError("--attention" if attention is not None and "attention" in str(e) else "--dtype", "",
                         str(e)) from None


def context_cut(name_or_path: str, seq_len: int | None) -> str | None:
    """The one line saying a Hugging Face config's context was cut to the default sequence length (``seq_len``
    None: no ``--seq-len``), or None (another model, or nothing cut)."""
    if not name_or_path.endswith(".json") or not exists(Path(name_or_path)):
        return None
    return hf_context_cut(read_json(Path(name_or_path)), name_or_path, seq_len)


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
    name: PrintableName = Field(min_length=1, max_length=256)
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
    name: PrintableName | None = Field(default=None, min_length=1, max_length=256)
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
    try:
        spec = _BasedSpec.model_validate(raw)
    except ValidationError as e:
        raise from_pydantic(source, e, _BasedSpec) from None
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
        raise from_pydantic(source, e, _ModelSpec) from None
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
