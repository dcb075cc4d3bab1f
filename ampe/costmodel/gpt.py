"""GPT-style decoders (GPT-2, GPT-3, tiny CPU configs) as DeepSpeed pipe layer lists, and their zoo entries.

Layout (L + 6 entries; see :mod:`ampe.costmodel.model`)::

    0 embedding (tied "embed") | 1 noop | 2..L+1 transformer | L+2 noop | L+3 norm
    | L+4 logits (tied "embed") | L+5 noop
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ampe.costmodel.kernels import embedding_kernels, gpt_block_kernels, lm_head_kernels, norm_kernels
from ampe.costmodel.model import BYTES_PER_ELEM, Layer, Model


@dataclass(frozen=True)
class GptConfig:
    """Shape of a GPT-style decoder."""

    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    dtype: str = "fp16"

    def build(self, name: str, attention: str, source: str) -> Model:
        """:func:`gpt_model` of this shape."""
        return gpt_model(name, self, attention, source)


def _transformer_act(s: int, h: int, a: int, b: int) -> tuple[float, float, float, float, float, float]:
    """Korthikanti et al. 2022 (no recompute, no sequence parallel), split into tensors and dropout masks.

    Per sample: kept elements 4·s·h (LayerNorm, attention and MLP inputs) + (12·s·h + 2·a·s²)/t (Q, K, V,
    projection input, MLP intermediate and GELU output, softmax and its dropout), plus dropout-mask elements
    2·s·h + a·s²/t. At 2-byte activations and 1-byte masks this is the paper's s·h·(10 + 24/t) + 5·a·s²/t bytes.
    Beyond the paper: the two LayerNorms' mean and 1/σ (4·s elements, which the paper leaves out; in the activations'
    dtype on CPU, measured by ``benchmarks/memory_probe.py``; fp32 on CUDA at 16-bit, 8·s bytes more: not counted).
    Returns (fixed bytes, sharded bytes, fixed mask elements, sharded mask elements, sharded score bytes, sharded
    score mask elements); the last two are attention's s² part (softmax output and its dropout, the dropout mask),
    which FlashAttention and selective recomputation drop."""
    return (4 * s * h + 4 * s) * b, 12 * s * h * b, 2 * s * h, 0, 2 * a * s * s * b, a * s * s


def gpt_model(name: str, cfg: GptConfig, attention: str = "eager", source: str = "zoo") -> Model:
    """Build the DeepSpeed pipe layer list (L + 6 entries) for a GPT decoder; ``attention`` as
    :meth:`Model.with_attention`."""
    s, h, a, v, b = cfg.seq_len, cfg.hidden, cfg.heads, cfg.vocab, BYTES_PER_ELEM[cfg.dtype]
    sh = s * h
    block_params = 12 * h * h + 13 * h
    block_flops = 24 * s * h * h + 4 * s * s * h
    fixed, sharded, mfixed, msharded, score, score_mask = _transformer_act(s, h, a, b)
    # FlashAttention (SDPA) keeps its output (the projection's input, counted above) and the fp32 log-sum-exp of
    # the scores per query and head for its backward
    lse = 4.0 * a * s if attention == "flash" else 0.0
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
                            act_bytes_sharded=sharded + lse, mask_elems_fixed=mfixed, mask_elems_sharded=msharded,
                            tp_allreduces=2, tp_allreduce_elems=sh, tp_shardable=True,
                            score_bytes_sharded=score, score_mask_elems_sharded=score_mask,
                            score_flops=4.0 * s * s * h, input_bytes=sh * b,
                            bwd_work_bytes_sharded=2.0 * s * 4 * h * b, score_grad_bytes_sharded=float(a * s * s * b),
                            buffer_bytes=float(s * s if attention == "eager" else 0),  # eager's causal mask (bool)
                            gemms=block_gemms, elementwise=block_ew))
    layers += [
        Layer("noop1", "noop", 0, 0.0, sh),
        # keeps its input and the mean and 1/σ per token
        Layer("final_norm", "norm", 2 * h, 5.0 * sh, sh, act_bytes_fixed=(sh + 2 * s) * b,
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
