"""Llama-family decoders (Llama 2/3, Mistral, Qwen2) as DeepSpeed pipe layer lists, and their zoo entries.

Layout (L + 4 entries, indices 0..L+3; no position embedding, no dropout)::

    0 embedding | 1..L transformer | L+1 final RMSNorm | L+2 logits (LM head) | L+3 noop

The LM head shares the embedding's weight only where the config ties them (``tie_word_embeddings``: Llama 3.2 1B/3B).

A block counts (per sample, tp = 1; q = heads·head_dim, k = kv_heads·head_dim, f = intermediate size)::

    params = h·q + 2·h·k + q·h          attention: Q, K, V (grouped-query: k ≤ q) and output projections
             + 3·h·f                    SwiGLU MLP: gate, up, down
             + 2·h                      two RMSNorm weights (no biases)
             + q + 2·k                  Q/K/V biases (Qwen2 only)
    fwd_flops = 2·s·(h·q + 2·h·k + q·h + 3·h·f) + 4·s·w·q    w = s (a sliding window is masked, not skipped)

Activations kept for backward (bytes per sample at 16-bit, fused RMSNorm and SwiGLU-as-in-PyTorch, no dropout),
counted the way Korthikanti et al. count a GPT block::

    fixed   (replicated over tp):  8·s·h + 4·s     two RMSNorm inputs + two RMSNorm outputs (the projections' inputs)
                                                   and the two norms' 1/rms
    sharded (÷ tp):                2·s·q           Q (after rotary)
                                   + 2·s·q         attention output (the output projection's input)
                                   + 8·s·f         gate and up outputs, SiLU output, their product (down's input)
    K/V (÷ min(tp, kv_heads)):     4·s·k           K (after rotary) and V, one copy per K/V head: kept by flash and
                                                   by selective recomputation; a rank holds the K/V heads its query
                                                   heads use (replicated where kv_heads < tp)
    flash   (÷ tp, flash only):    4·a·s           SDPA's fp32 log-sum-exp per query and head
    scores  (÷ tp, eager only):    2·a·s·w         softmax output (no attention dropout in these models)
                                   + 4·s·q         K and V copied for each query head of their group (eager
                                                   attention's broadcast matmuls copy them, as Hugging Face's
                                                   ``repeat_kv`` does, and keep only the copies; FlashAttention
                                                   reads the shared heads)

Rotary embeddings hold no per-sample state beyond Q and K (cos/sin are shared buffers).

While a block's backward runs, more is alive on top of what it keeps (``bwd_work_bytes_sharded`` and
``score_grad_bytes_sharded``; per sample ÷ tp): 2·s·f·bytes of MLP gradients and, with eager attention, the gradient of
the scores, a·s·w·bytes (selective recomputation re-creates the softmax output too). Measured on CPU for llama-small
(s 1024, h 512, f 1376, 8 heads, fp32) with the allocation trace: 13.4 / 46.1 / 83.6 MiB per sample for flash / eager
/ eager-selective, against 11.3 / 43.3 / 78.3 MiB here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ampe.costmodel.kernels import embedding_kernels, llama_block_kernels, lm_head_kernels, norm_kernels
from ampe.costmodel.model import BYTES_PER_ELEM, Layer, Model


@dataclass(frozen=True)
class LlamaConfig:
    """Shape of a Llama-style decoder (the Hugging Face config fields, in ampe's names)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq_len: int
    tied: bool = False  # tie_word_embeddings
    qkv_bias: bool = False  # Qwen2
    head_dim: int = 0  # 0: hidden / heads
    sliding_window: int = 0  # 0: none (Mistral 7B v0.1: 4096)
    dtype: str = "bf16"

    @property
    def head_size(self) -> int:
        """Per-head dimension."""
        return self.head_dim or self.hidden // self.heads

    def build(self, name: str, attention: str, source: str) -> Model:
        """:func:`llama_model` of this shape."""
        return llama_model(name, self, attention, source)


def llama_block_params(cfg: LlamaConfig) -> int:
    """Parameters of one transformer block (attention + SwiGLU MLP + two RMSNorms [+ Q/K/V biases])."""
    h, q, k = cfg.hidden, cfg.heads * cfg.head_size, cfg.kv_heads * cfg.head_size
    bias = q + 2 * k if cfg.qkv_bias else 0
    return h * q + 2 * h * k + q * h + 3 * h * cfg.ffn + 2 * h + bias


def llama_block_buffer_bytes(cfg: LlamaConfig, attention: str) -> int:
    """Module buffers of one block of ampe's runtime (``llama_pipe.Block``), bytes: the rotary cos and sin tables
    (s × head_dim each, fp32: DeepSpeed keeps buffers in fp32) and, for eager attention or a sliding window, the s²
    causal mask (bool)."""
    s = cfg.seq_len
    masked = attention == "eager" or 0 < cfg.sliding_window < s
    return 2 * s * cfg.head_size * 4 + (s * s if masked else 0)


def llama_model(name: str, cfg: LlamaConfig, attention: str = "flash", source: str = "zoo") -> Model:
    """Build the pipe layer list (L + 4 entries) of a Llama-style decoder; ``attention`` as
    :meth:`ampe.costmodel.model.Model.with_attention`."""
    s, h, a, v, b = cfg.seq_len, cfg.hidden, cfg.heads, cfg.vocab, BYTES_PER_ELEM[cfg.dtype]
    q, k, f = cfg.heads * cfg.head_size, cfg.kv_heads * cfg.head_size, cfg.ffn
    # Keys each query's attention computes over: the whole sequence, also under a sliding window narrower than it.
    # ampe's runtime masks the window (eager: the s×s scores are written out, then masked; flash: torch's SDPA with a
    # band mask, whose kernels compute every score): what runs does the s² work and, eager, keeps s² scores. (Only
    # FlashAttention with a window argument, not used here, skips the blocks outside it.)
    w = s
    sh = s * h
    matmul_params = h * q + 2 * h * k + q * h + 3 * h * f
    block_flops = 2.0 * s * matmul_params + 4.0 * s * w * q
    tied = "embed" if cfg.tied else None
    lse = 4.0 * a * s if attention == "flash" else 0.0  # SDPA's fp32 log-sum-exp per query and head
    block_gemms, block_ew = llama_block_kernels(s, h, a, cfg.kv_heads, cfg.head_size, f, w, b)
    embed_gemms, embed_ew = embedding_kernels(s, h, v, b, positions=False, dropout=False)
    head_gemms, head_ew = lm_head_kernels(s, h, v, b)
    layers: list[Layer] = [
        Layer("embed", "embedding", v * h, 0.0, sh, act_bytes_fixed=8 * s, tied=tied, tied_params=v * h if tied else 0,
              tp_allreduces=1, tp_allreduce_elems=sh, tp_shardable=True, gemms=embed_gemms,
              elementwise=embed_ew),
    ]
    for i in range(cfg.layers):
        layers.append(Layer(
            f"block{i}", "transformer", llama_block_params(cfg), block_flops, sh,
            act_bytes_fixed=(4 * sh + 2 * s) * b, act_bytes_sharded=(2 * s * q + 4 * s * f) * b + lse,
            kv_bytes=2.0 * s * k * b, kv_heads=cfg.kv_heads,
            tp_allreduces=2, tp_allreduce_elems=sh, tp_shardable=True,
            score_bytes_sharded=float((a * s * w + 2 * s * q) * b), score_flops=4.0 * s * w * q,
            input_bytes=sh * b, bwd_work_bytes_sharded=2.0 * s * f * b, score_grad_bytes_sharded=float(a * s * w * b),
            buffer_bytes=float(llama_block_buffer_bytes(cfg, attention)), gemms=block_gemms, elementwise=block_ew))
    layers += [
        Layer("final_norm", "norm", h, 4.0 * sh, sh, act_bytes_fixed=(sh + s) * b,  # its input and 1/rms
              elementwise=norm_kernels(s, h, b)[1]),
        Layer("logits", "logits", v * h, 2.0 * s * h * v, s * v, act_bytes_fixed=sh * b, tied=tied,
              tied_params=v * h if tied else 0, tp_shardable=True, gemms=head_gemms,
              elementwise=head_ew),
        Layer("noop", "noop", 0, 0.0, s * v),
    ]
    model = Model(name, tuple(layers), seq_len=s, hidden=h, heads=a, vocab=v, dtype=cfg.dtype, source=source,
                  family="llama")
    model = model.with_attention(attention)  # no config yet: zeroes the score fields for flash
    return replace(model, config=cfg)


# Published configs (config.json on the Hugging Face hub, by name). Sequence length: the planning default
# (docs/cost_model.md), not the model's maximum context.
LLAMA_ZOO: dict[str, LlamaConfig] = {
    "llama-3.2-1b": LlamaConfig(16, 2048, 32, 8, 8192, 128256, 4096, tied=True, head_dim=64),
    "llama-3.2-3b": LlamaConfig(28, 3072, 24, 8, 8192, 128256, 4096, tied=True, head_dim=128),
    "llama-3.1-8b": LlamaConfig(32, 4096, 32, 8, 14336, 128256, 4096),
    "llama-3.1-70b": LlamaConfig(80, 8192, 64, 8, 28672, 128256, 4096),
    "llama-3.1-405b": LlamaConfig(126, 16384, 128, 8, 53248, 128256, 4096),
    "llama-2-7b": LlamaConfig(32, 4096, 32, 32, 11008, 32000, 4096),
    "mistral-7b": LlamaConfig(32, 4096, 32, 8, 14336, 32000, 4096, sliding_window=4096),  # v0.1
    "qwen2.5-7b": LlamaConfig(28, 3584, 28, 4, 18944, 152064, 4096, qkv_bias=True),
    # CPU configs (fp32, eager attention by default): tiny trains in seconds; small (seq 1024, GQA 8:2) is where
    # the s² scores are a large share of the memory, so eager and flash differ as they do on GPUs
    "llama-tiny": LlamaConfig(4, 128, 4, 2, 344, 2048, 128, dtype="fp32"),
    "llama-small": LlamaConfig(4, 512, 8, 2, 1376, 8192, 1024, dtype="fp32"),
}


def default_attention(dtype: str) -> str:
    """The attention kernel a Llama-family model is planned with when none is asked for: FlashAttention (SDPA) at
    16-bit, eager at fp32 (the CPU trials' default)."""
    return "eager" if dtype == "fp32" else "flash"


def llama_zoo_model(name: str, attention: str | None = None) -> Model:
    """A zoo Llama-family model, with ``attention`` or :func:`default_attention`."""
    cfg = LLAMA_ZOO[name]
    return llama_model(name, cfg, attention or default_attention(cfg.dtype))
