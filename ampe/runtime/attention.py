"""Core attention as the plan names it, and a record of the kernel that actually ran.

``flash`` calls ``torch.nn.functional.scaled_dot_product_attention`` (causal; grouped-query heads shared, not
copied). Which kernel torch picks behind it depends on the device, the dtype, the shapes and dropout: a FlashAttention
kernel (CUDA, and ``_scaled_dot_product_flash_attention_for_cpu`` on CPU), the memory-efficient or cuDNN kernel (none
of which keep the s² scores), or the *math* fallback, which writes the scores out like eager attention does (on CPU
whenever attention dropout is on). ``eager`` is the written-out form (scores, mask, softmax, dropout, ·V).

The first call in a process is run under a dispatch mode that lists the ATen operators below the SDPA call, so the
rank report can say which kernel ran (:func:`kernel_ran`; the values and what they keep:
:data:`ampe.formats.worker.ATTENTION_KERNELS`) and the report can flag a plan whose memory assumed no scores while the
math fallback kept them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

# ATen operator name fragment → kernel name; checked in order (the first match wins)
_SDPA_KERNELS = (
    ("_scaled_dot_product_flash_attention", "sdpa-flash"),
    ("_scaled_dot_product_efficient_attention", "sdpa-mem-efficient"),
    ("_scaled_dot_product_cudnn_attention", "sdpa-cudnn"),
    ("_flash_attention_forward", "sdpa-flash"),
    ("_efficient_attention_forward", "sdpa-mem-efficient"),
)

_ran: dict[str, str] = {}  # "kernel" → the kernel of the first call in this process


class _OperatorNames(TorchDispatchMode):
    """Lists the ATen operators called under it (below autograd: the kernels, not the Python API)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def sdpa_kernel_of(names: list[str]) -> str:
    """The SDPA kernel behind a list of ATen operator names: one of the fused kernels, else ``sdpa-math``."""
    for fragment, kernel in _SDPA_KERNELS:
        if any(fragment in n for n in names):
            return kernel
    return "sdpa-math"


def kernel_ran() -> str | None:
    """The attention kernel of this process's first attention call (``eager``, ``sdpa-flash``,
    ``sdpa-mem-efficient``, ``sdpa-cudnn`` or ``sdpa-math``), None before any."""
    return _ran.get("kernel")


def note_eager() -> None:
    """Record that the written-out (eager) attention ran, unless a kernel is recorded already."""
    _ran.setdefault("kernel", "eager")


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                    attn_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Causal SDPA of ``q`` (b, a, s, d) over ``k``/``v`` (b, g, s, d), g dividing a (grouped-query heads are
    shared, not copied). ``attn_mask`` (bool, True = attend) replaces the causal flag (a sliding window). The first
    call in the process records the kernel torch chose."""
    gqa = k.shape[1] != q.shape[1]
    causal = attn_mask is None

    def call() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=causal,
                                              enable_gqa=gqa)

    if "kernel" in _ran:
        return call()
    with _OperatorNames() as ops:
        out = call()
    _ran["kernel"] = sdpa_kernel_of(ops.names)
    return out
