"""Hugging Face ``config.json`` files (read from disk, never downloaded) as ampe models.

Supported ``model_type``: ``llama``, ``mistral``, ``qwen2`` (the Llama family, :mod:`ampe.costmodel.llama`) and
``gpt2``. Anything else is refused with one line naming the field. Sequence length: ``seq_len`` when given (at most
the model's context, ``max_position_embeddings``/``n_positions``), else ``min(context, DEFAULT_SEQ_LEN)`` (planning a
128k-context model at its full context is rarely what a pre-training run does; the CLI says so in one line,
:func:`context_cut`); precision: ``torch_dtype`` (float32 → fp32, float16 → fp16, bfloat16 or absent → bf16; any
other dtype refused). Booleans must be JSON booleans (``"false"`` is refused, not truthy) and ``sliding_window`` an
integer or null.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ampe.costmodel.gpt import GptConfig, gpt_model
from ampe.costmodel.llama import LlamaConfig, default_attention, llama_model
from ampe.costmodel.model import SHAPE_LIMITS, Model
from ampe.errors import InputError

LLAMA_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED = (*LLAMA_TYPES, "gpt2")
DEFAULT_SEQ_LEN = 4096
_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


# the shape figure (model.SHAPE_LIMITS) each config key gives; the positions are capped at DEFAULT_SEQ_LEN anyway
_SHAPE_OF = {"n_layer": "layers", "num_hidden_layers": "layers", "n_embd": "hidden", "hidden_size": "hidden",
             "n_head": "heads", "num_attention_heads": "heads", "num_key_value_heads": "kv_heads",
             "intermediate_size": "ffn", "vocab_size": "vocab", "head_dim": "head_dim",
             "sliding_window": "sliding_window"}


def _int(raw: dict[str, Any], key: str, source: str, default: int | None = None, lo: int = 1) -> int:
    v = raw.get(key, default)
    if v is None:
        raise InputError(source, key, "missing")
    hi = SHAPE_LIMITS[_SHAPE_OF[key]] if key in _SHAPE_OF else 10**9  # the model YAML's limits (one table)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise InputError(source, key, f"must be an integer in {lo}..{hi}, got {v!r}")
    return v


def _bool(raw: dict[str, Any], key: str, source: str) -> bool:
    """A JSON boolean of the config (absent or null: false); ``"false"`` or 0 is refused, never read as truthy."""
    v = raw.get(key)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise InputError(source, key, f"must be true or false, got {v!r}")
    return v


def _window(raw: dict[str, Any], mtype: str, source: str) -> int:
    """The sliding attention window (tokens; 0: none): Mistral's, or another family's with ``use_sliding_window``.
    Null means none; anything but an integer in range is refused."""
    if not (mtype == "mistral" or _bool(raw, "use_sliding_window", source)):
        return 0
    if raw.get("sliding_window") is None:
        return 0
    return _int(raw, "sliding_window", source)


def _dtype(raw: dict[str, Any], source: str) -> str:
    """ampe's precision of ``torch_dtype`` (absent: bf16); a dtype ampe does not plan (float64, int8) is refused."""
    v = raw.get("torch_dtype", "bfloat16")
    if v not in _DTYPES:
        raise InputError(source, "torch_dtype", f"{v!r}: ampe plans {', '.join(_DTYPES)} only")
    return _DTYPES[v]


def context(raw: Any, source: str) -> tuple[str, int]:
    """The config's context length (tokens) and the key it is under (``max_position_embeddings``; GPT-2:
    ``n_positions``)."""
    key = "n_positions" if isinstance(raw, dict) and raw.get("model_type") == "gpt2" else "max_position_embeddings"
    return key, _int(raw, key, source, 1024 if key == "n_positions" else DEFAULT_SEQ_LEN)


def _seq_len(raw: dict[str, Any], source: str, seq_len: int | None) -> int:
    key, ctx = context(raw, source)
    if seq_len is None:
        return min(ctx, DEFAULT_SEQ_LEN)
    if seq_len > ctx:
        raise InputError("--seq-len", "", f"{seq_len} tokens is above {source}'s context ({key} {ctx})")
    return seq_len


def context_cut(raw: Any, source: str, seq_len: int | None) -> str | None:
    """One line saying that the model is planned at a shorter sequence than its context by default (``seq_len``
    None and the context above ``DEFAULT_SEQ_LEN``), or None."""
    if seq_len is not None or not isinstance(raw, dict):
        return None
    key, ctx = context(raw, source)
    if ctx <= DEFAULT_SEQ_LEN:
        return None
    return (f"model: {source}: context {ctx} tokens ({key}), planned at seq_len {DEFAULT_SEQ_LEN} (ampe's default "
            f"for Hugging Face configs; --seq-len N, up to {ctx}, plans another)")


def model_from_hf_config(raw: Any, source: str, attention: str | None = None, seq_len: int | None = None) -> Model:
    """The ampe model of a parsed Hugging Face config; ``attention`` None: flash at 16-bit, eager at fp32;
    ``seq_len`` (tokens) None: the context, at most ``DEFAULT_SEQ_LEN``; above the context: InputError."""
    if not isinstance(raw, dict):
        raise InputError(source, "(root)", "a Hugging Face config must be a JSON object")
    mtype = raw.get("model_type")
    if mtype not in SUPPORTED:
        arch = raw.get("architectures")
        what = f"model_type {mtype!r}" if mtype is not None else f"architectures {arch!r}"
        raise InputError(source, "model_type", f"unsupported architecture ({what}); ampe knows "
                         + ", ".join(SUPPORTED))
    dtype = _dtype(raw, source)
    name = raw.get("_name_or_path") or Path(source).parent.name or Path(source).stem
    if not isinstance(name, str):
        name = Path(source).stem
    name = name.rstrip("/").split("/")[-1] or "hf-model"
    if not name.isprintable() or "," in name:  # the name is printed and is a profile's model column
        raise InputError(source, "_name_or_path", f"{name[:40]!r}: a model name must be printable text without commas")
    if mtype == "gpt2":
        if _int(raw, "n_embd", source) % _int(raw, "n_head", source):
            raise InputError(source, "n_head", f"{raw['n_head']} does not divide n_embd {raw['n_embd']}")
        cfg = GptConfig(_int(raw, "n_layer", source), _int(raw, "n_embd", source), _int(raw, "n_head", source),
                        _int(raw, "vocab_size", source), _seq_len(raw, source, seq_len), dtype)
        return gpt_model(name, cfg, attention or "eager", source)
    hidden = _int(raw, "hidden_size", source)
    heads = _int(raw, "num_attention_heads", source)
    kv = _int(raw, "num_key_value_heads", source, heads)
    if heads % kv:
        raise InputError(source, "num_key_value_heads", f"{kv} does not divide num_attention_heads {heads}")
    head_dim = raw.get("head_dim") or 0
    if head_dim == 0 and hidden % heads:
        raise InputError(source, "num_attention_heads", f"{heads} does not divide hidden_size {hidden}")
    window = _window(raw, mtype, source)
    cfg2 = LlamaConfig(
        layers=_int(raw, "num_hidden_layers", source), hidden=hidden, heads=heads, kv_heads=kv,
        ffn=_int(raw, "intermediate_size", source), vocab=_int(raw, "vocab_size", source),
        seq_len=_seq_len(raw, source, seq_len),
        tied=_bool(raw, "tie_word_embeddings", source),
        qkv_bias=mtype == "qwen2" or _bool(raw, "attention_bias", source),
        head_dim=_int(raw, "head_dim", source) if head_dim else 0, sliding_window=window, dtype=dtype)
    if cfg2.head_size % 2:  # rotary embeddings rotate pairs of dimensions
        raise InputError(source, "head_dim" if cfg2.head_dim else "num_attention_heads",
                         f"the head dimension {cfg2.head_size} must be even (rotary embeddings)")
    return llama_model(name, cfg2, attention or default_attention(dtype), source=source)
