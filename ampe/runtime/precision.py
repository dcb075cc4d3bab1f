"""Whether fp32 matrix products run as TF32, as a plan says, and what ran.

A plan entry's ``tf32`` (``ampe search --tf32 on|off``) sets ``torch.backends.cuda.matmul.allow_tf32`` and
``torch.backends.cudnn.allow_tf32`` in every rank before the model is built; None (an older plan, a job without the
field) leaves PyTorch's defaults (matmul off, cuDNN on). The rank report records both flags as they stood when
training began. On a CPU or a GPU without TF32 tensor cores the flags change nothing (the cost model prices fp32
there either way).
"""

from __future__ import annotations

from typing import Any


def apply_tf32(torch: Any, allow: bool | None) -> dict[str, bool]:
    """Set both TF32 flags to ``allow`` (None: leave them as they are) and return what is now in force, as the
    record's ``{"matmul": bool, "cudnn": bool}``."""
    if allow is not None:
        torch.backends.cuda.matmul.allow_tf32 = bool(allow)
        torch.backends.cudnn.allow_tf32 = bool(allow)
    return {"matmul": bool(torch.backends.cuda.matmul.allow_tf32), "cudnn": bool(torch.backends.cudnn.allow_tf32)}
