"""The activation memory each layer kind keeps, measured on this machine's CPU, against the cost model (issue 32,
item 3): for GPT-2 and Llama-family models at fp32 and bf16, tp 1 and 2, eager and flash attention, one row per
layer kind (embedding, GPT/Llama block, final norm, LM head) and the loss's working set, with the model's error.

Measured by :mod:`ampe.profiling.memory_kinds` (what autograd keeps after one forward of the layer as the trial worker
builds it; the loss's peak above its logits over one forward and backward; tp 2 in two gloo processes).
tests/profiling/test_memory_kinds.py holds the model to these figures on the tiny models; this prints them, also
for larger ones.

Run: .venv/bin/python benchmarks/memory_probe.py [--models gpt2-tiny,llama-tiny] [--mbs 2] [--tp 1,2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ampe.profiling.memory_kinds import probe_kinds_tp_each


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="gpt2-tiny,llama-tiny", help="zoo models, comma-separated")
    p.add_argument("--mbs", type=int, default=2, help="micro-batch size (default 2)")
    p.add_argument("--tp", default="1,2", help="tensor-parallel degrees (default 1,2)")
    args = p.parse_args()
    print(f"{'model':<12} {'dtype':<5} {'attn':<5} {'tp':>2} {'kind':<12} {'measured B':>12} {'model B':>12} "
          f"{'error':>8}")
    worst: dict[tuple[str, str], float] = {}
    for name in args.models.split(","):
        for dtype in ("fp32", "bf16"):
            for tp in (int(t) for t in args.tp.split(",")):
                for attention, rows in probe_kinds_tp_each(name, ("eager", "flash"), dtype, tp, args.mbs).items():
                    for r in rows:
                        print(f"{name:<12} {dtype:<5} {attention:<5} {tp:>2} {r.kind:<12} {r.measured_bytes:>12,d} "
                              f"{r.modelled_bytes:>12,.0f} {100 * r.error:>+7.2f}%", flush=True)
                        key = (r.kind, dtype)
                        worst[key] = max(worst.get(key, 0.0), abs(r.error), key=abs)
    print("\nworst |error| per layer kind and precision:")
    for (kind, dtype), err in sorted(worst.items()):
        print(f"  {kind:<12} {dtype:<5} {100 * err:6.2f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
