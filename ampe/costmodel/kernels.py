"""A layer's kernels: its matrix products (GEMMs) and its memory-bound element-wise passes.

What the roofline (:func:`ampe.costmodel.compute.roofline_times`) times, kernel by kernel. Figures are for **one
sample at tensor-parallel degree 1**; :meth:`Gemm.call` and :meth:`Elementwise.bytes` scale them to one call on a
micro-batch of ``mbs`` samples on one tensor-parallel rank.

A :class:`Gemm` is ``batch`` products ``C (m×n) = A (m×k) · B (k×n)`` in the training precision:

* a *linear* GEMM (a weight matrix B, the default): the micro-batch multiplies ``m`` (its rows are tokens) and the
  weight is read once per call; its backward is two GEMMs of the same size (input gradient, weight gradient) plus
  the weight gradient's accumulation into the gradient buffer (read and write, memory-bound);
* an *attention* GEMM (``attention=True``: QKᵀ and ·V, both operands per-sample activations): the micro-batch
  multiplies ``batch`` (one product per head and sample). FlashAttention fuses a layer's attention GEMMs (and the
  softmax between them) into one kernel that never writes the scores.

Tensor parallelism (Megatron) divides one dimension: ``split`` ``"n"`` (column-parallel: QKV, MLP up-projections,
the vocabulary-parallel LM head), ``"k"`` (row-parallel: attention output and MLP down-projection), ``"batch"``
(attention heads) or ``"none"``.

An :class:`Elementwise` is a memory-bound pass (norm, activation, dropout, residual add, rotary, layout copy,
softmax, the loss): bytes read plus written in forward and in backward. ``eager`` passes are attention's s²
ones (scale, mask, softmax, dropout over the scores), which FlashAttention does not run.

The builders below describe the layers as ampe's runtime (``ampe.runtime.gpt_pipe``, ``ampe.runtime.llama_pipe``:
eager PyTorch, one kernel per operation) runs them — what profiles and trials measure. Conventions, per element
of ``b`` bytes: a unary pass reads and writes its tensor (2b), its backward reads the gradient and the saved input
and writes the input gradient (3b); a binary pass (residual add, product) reads two and writes one (3b); dropout
masks take 1 byte per element; a softmax over a row that fits in the last-level cache (a score row, a vocabulary
row of ≤ 1 MB) is read once from memory however many passes it makes.
"""

from __future__ import annotations

from dataclasses import dataclass

SPLITS = ("none", "n", "k", "batch")
F32 = 4  # bytes per fp32 element (the loss's log-softmax)


@dataclass(frozen=True)
class Gemm:
    """``batch`` matrix products C (m×n) = A (m×k) · B (k×n) of one sample's forward pass at tp = 1."""

    name: str
    m: int  # rows of A and C (tokens of one sample)
    n: int  # columns of B and C
    k: int  # the reduction dimension
    batch: int = 1  # independent products per sample (attention: one per head)
    split: str = "none"  # the dimension tensor parallelism divides: "none", "n", "k" or "batch"
    attention: bool = False  # QKᵀ or ·V: both operands per-sample activations (mbs multiplies batch, not m)

    @property
    def flops(self) -> float:
        """Forward FLOPs per sample at tp = 1: 2·batch·m·n·k."""
        return 2.0 * self.batch * self.m * self.n * self.k

    def call(self, tp: int, mbs: int) -> tuple[float, float, float, float]:
        """(batch, m, n, k) of one call on a micro-batch of ``mbs`` samples on one of ``tp`` ranks."""
        batch, m, n, k = float(self.batch), float(self.m), float(self.n), float(self.k)
        if self.attention:
            batch *= mbs
        else:
            m *= mbs
        if self.split == "n":
            n /= tp
        elif self.split == "k":
            k /= tp
        elif self.split == "batch":
            batch /= tp
        return batch, m, n, k

    def call_flops(self, tp: int, mbs: int) -> float:
        """FLOPs of one forward call (``mbs`` samples, one tp rank)."""
        batch, m, n, k = self.call(tp, mbs)
        return 2.0 * batch * m * n * k

    def call_bytes(self, tp: int, mbs: int, elem_bytes: int) -> float:
        """Bytes one forward call reads and writes: A and C per product, B once for a weight (linear GEMM)."""
        batch, m, n, k = self.call(tp, mbs)
        weight = k * n if not self.attention else batch * k * n
        return elem_bytes * (batch * (m * k + m * n) + weight)

    def aligned(self, tp: int, elem_bytes: int) -> bool:
        """Whether the call's leading dimensions (n and k: PyTorch's row-major operands, forward and backward) are
        multiples of 16 bytes, which tensor-core GEMM kernels (16-bit, TF32) need for their vector loads (GPT-2's
        vocabulary of 50,257 is not)."""
        _, _, n, k = self.call(tp, 1)
        q = 16 // elem_bytes
        return n.is_integer() and k.is_integer() and int(n) % q == 0 and int(k) % q == 0

    def weight_bytes(self, tp: int, elem_bytes: int) -> float:
        """Bytes of the weight B on one tp rank (0 for an attention GEMM): what the weight-gradient accumulation
        reads and writes once per backward call."""
        if self.attention:
            return 0.0
        _, _, n, k = self.call(tp, 1)
        return elem_bytes * k * n


@dataclass(frozen=True)
class Elementwise:
    """A memory-bound pass of a layer: bytes read plus written per sample at tp = 1 (or per call)."""

    name: str
    fwd_bytes: float
    bwd_bytes: float
    split: bool = False  # divided by tensor parallelism (inside the sharded attention or MLP)
    eager: bool = False  # attention's s² passes: absent with FlashAttention
    per_call: bool = False  # bytes per call, not per sample (a dense embedding gradient)

    def bytes(self, tp: int, mbs: int, backward: bool = False) -> float:
        """Bytes of one call on ``mbs`` samples on one of ``tp`` ranks, forward or backward."""
        b = self.bwd_bytes if backward else self.fwd_bytes
        return b * (1 if self.per_call else mbs) / (tp if self.split else 1)


Kernels = tuple[tuple[Gemm, ...], tuple[Elementwise, ...]]


def _norm(name: str, e: float, b: int) -> Elementwise:
    """A LayerNorm/RMSNorm over ``e`` elements: read and write (2b), backward 3b (its statistics are tiny)."""
    return Elementwise(name, 2.0 * e * b, 3.0 * e * b)


def _dropout(name: str, e: float, b: int, split: bool = False, eager: bool = False) -> Elementwise:
    """Dropout over ``e`` elements: read, write, a 1-byte mask; backward reads the gradient and mask, writes."""
    return Elementwise(name, (2.0 * b + 1) * e, (2.0 * b + 1) * e, split=split, eager=eager)


def _mask_fill(name: str, sc: float, b: int) -> Elementwise:
    """``scores.masked_fill(mask, -inf)`` over ``sc`` scores, as ATen runs the out-of-place form: a contiguous clone
    (read, write), then ``masked_fill_`` in place (read, write, and the broadcast bool mask: 1 byte per score, since
    one head's scores stream through the last-level cache between two reads of the mask); its backward
    ``grad.masked_fill(mask, 0)`` is the same two passes over the gradient."""
    return Elementwise(name, (4.0 * b + 1) * sc, (4.0 * b + 1) * sc, split=True, eager=True)


def _add(name: str, e: float, b: int) -> Elementwise:
    """A residual add (read two, write one); in backward autograd sums the two gradient paths the same way."""
    return Elementwise(name, 3.0 * e * b, 3.0 * e * b)


def gpt_block_kernels(s: int, h: int, a: int, b: int, dropout: bool = True) -> Kernels:
    """A pre-LN GPT-2 block (``ampe.runtime.gpt_pipe.Block``): QKV, QKᵀ, ·V, projection, MLP (4h, GELU), with
    attention, residual and attention-probability dropout. GEMM FLOPs: 24·s·h² + 4·s²·h."""
    d = h // a
    e, sc = float(s * h), float(a * s * s)
    gemms = (
        Gemm("qkv", s, 3 * h, h, split="n"),
        Gemm("scores", s, s, d, batch=a, split="batch", attention=True),
        Gemm("context", s, d, s, batch=a, split="batch", attention=True),
        Gemm("proj", s, h, h, split="k"),
        Gemm("fc1", s, 4 * h, h, split="n"),
        Gemm("fc2", s, h, 4 * h, split="k"),
    )
    ew = [
        _norm("ln1", e, b), _norm("ln2", e, b), _add("residual1", e, b), _add("residual2", e, b),
        Elementwise("qkv_layout", 6.0 * e * b, 6.0 * e * b, split=True),  # (3, b, a, s, d) contiguous copy
        Elementwise("context_layout", 2.0 * e * b, 2.0 * e * b, split=True),  # heads back to (b, s, h)
        Elementwise("gelu", 8.0 * e * b, 12.0 * e * b, split=True),  # over the 4h intermediate
        Elementwise("score_scale", 2.0 * sc * b, 2.0 * sc * b, split=True, eager=True),
        _mask_fill("score_mask", sc, b),
        Elementwise("softmax", 2.0 * sc * b, 3.0 * sc * b, split=True, eager=True),
    ]
    if dropout:
        ew += [_dropout("proj_dropout", e, b), _dropout("fc2_dropout", e, b),
               _dropout("attention_dropout", sc, b, split=True, eager=True)]
    return gemms, tuple(ew)


def llama_block_kernels(s: int, h: int, a: int, g: int, d: int, f: int, w: int, b: int) -> Kernels:
    """A Llama block (``ampe.runtime.llama_pipe.Block``): RMSNorm, Q/K/V (``g`` KV heads of size ``d``), rotary,
    grouped-query attention over ``w`` keys (the sliding window, else s), output projection, RMSNorm, SwiGLU (f).
    GEMM FLOPs: 2·s·(h·q + 2·h·k + q·h + 3·h·f) + 4·s·w·q with q = a·d, k = g·d."""
    q, kv = a * d, g * d
    e, sc = float(s * h), float(a * s * w)
    gemms = (
        Gemm("q", s, q, h, split="n"),
        Gemm("k", s, kv, h, split="n"),
        Gemm("v", s, kv, h, split="n"),
        Gemm("scores", s, w, d, batch=a, split="batch", attention=True),
        Gemm("context", s, d, w, batch=a, split="batch", attention=True),
        Gemm("o", s, h, q, split="k"),
        Gemm("gate", s, f, h, split="n"),
        Gemm("up", s, f, h, split="n"),
        Gemm("down", s, h, f, split="k"),
    )
    rot = 10.0 * s * (q + kv) * b  # rotate_half (neg, cat), ·cos, ·sin, add: about ten passes of Q and K
    ew = (
        _norm("norm1", e, b), _norm("norm2", e, b), _add("residual1", e, b), _add("residual2", e, b),
        Elementwise("rotary", rot, rot, split=True),
        Elementwise("query_layout", 2.0 * s * q * b, 2.0 * s * q * b, split=True),  # (b, g, a/g, s, d) copy
        Elementwise("context_layout", 2.0 * s * q * b, 2.0 * s * q * b, split=True),  # heads back to (b, s, q)
        # eager attention broadcasts each K/V head to its a/g query heads: a copy of K and V per query head
        Elementwise("kv_repeat", 2.0 * s * (kv + q) * b, 2.0 * s * (kv + q) * b, split=True, eager=True),
        Elementwise("swiglu", 5.0 * s * f * b, 8.0 * s * f * b, split=True),  # SiLU(gate) · up
        Elementwise("score_scale", 2.0 * sc * b, 2.0 * sc * b, split=True, eager=True),
        _mask_fill("score_mask", sc, b),
        Elementwise("softmax", 2.0 * sc * b, 3.0 * sc * b, split=True, eager=True),
    )
    return gemms, ew


def loss_bytes_per_logit(b: int) -> tuple[float, float]:
    """(forward, backward) bytes per logit of the cross-entropy over the vocabulary in fp32, as ``lm_loss``
    runs it (``F.cross_entropy(logits.float(), …)``): forward the fp32 upcast of 16-bit logits (read b, write 4)
    and the log-softmax (read and write fp32); backward the NLL's input gradient (write fp32), the log-softmax
    backward (read the gradient and its saved output, write), and the cast back (read fp32, write b)."""
    cast = float(b + F32) if b < F32 else 0.0
    return cast + 2.0 * F32, F32 + 3.0 * F32 + cast


def lm_head_kernels(s: int, h: int, v: int, b: int) -> Kernels:
    """The LM head (logits over the full vocabulary, vocabulary-parallel: split n) and the loss after it (vocab-
    parallel at tp > 1, each rank on its slice: split; its passes are counted as the tp = 1 cross-entropy's, a few
    more than Megatron's loss makes per logit). GEMM FLOPs: 2·s·h·v."""
    fwd, bwd = loss_bytes_per_logit(b)
    return (Gemm("lm_head", s, v, h, split="n"),), (Elementwise("loss", fwd * s * v, bwd * s * v, split=True),)


def embedding_kernels(s: int, h: int, v: int, b: int, positions: bool, dropout: bool) -> Kernels:
    """A (vocabulary-parallel) token embedding: the row gather, the learned positions' add and dropout (GPT-2);
    backward the dense V×h weight gradient (zeroed, rows added, accumulated: about four passes of the table,
    once per call)."""
    e = float(s * h)
    ew = [Elementwise("lookup", 2.0 * e * b, e * b),
          Elementwise("dense_grad", 0.0, 4.0 * v * h * b, split=True, per_call=True)]
    if positions:
        ew.append(_add("positions", e, b))
    if dropout:
        ew.append(_dropout("dropout", e, b))
    return (), tuple(ew)


def norm_kernels(s: int, h: int, b: int) -> Kernels:
    """A final LayerNorm/RMSNorm."""
    return (), (_norm("norm", float(s * h), b),)
