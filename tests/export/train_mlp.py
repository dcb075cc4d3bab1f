"""A user's own training script, not ampe's worker: an MLP stack as DeepSpeed ``LayerSpec``s, trained under a plan
that ``ampe export`` wrote, through the small ``ampe.runtime`` API. The export tests launch it with the exported
``launch.sh`` (torchrun on one host, DeepSpeed's multi-node runner across emulated hosts).

Layers match ``tests/export/mlp6.yaml`` (the model the plan was searched for): input 16 → 64, four 64 → 64 blocks,
head 64 → 10. Besides the measurements (``export.json``'s ``measurements``), each rank writes ``user_rank{R}.json``
into ``--report-dir``: where it ran, what it trained, whether the frequency plan was followed.

    python train_mlp.py [--warmup N] [--iters N] [--report-dir DIR] [--per run|iteration] [--timeout-s S]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.pipe import LayerSpec
from torch import nn

from ampe.runtime import load_export
from ampe.runtime.pipeline import optimizer_in_use

IN, HIDDEN, CLASSES = 16, 64, 10


class Block(nn.Module):
    """One hidden layer: linear + ReLU."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def layer_specs() -> list[LayerSpec]:
    return [LayerSpec(nn.Linear, IN, HIDDEN), *[LayerSpec(Block, HIDDEN) for _ in range(4)],
            LayerSpec(nn.Linear, HIDDEN, CLASSES)]


def batches(mbs: int, seed: int):
    """Endless micro-batches cycling through four fixed ones (the loss falls as the model memorises them)."""
    gen = torch.Generator().manual_seed(seed)
    pool = [(torch.randn(mbs, IN, generator=gen), torch.randint(0, CLASSES, (mbs,), generator=gen)) for _ in range(4)]
    i = 0
    while True:
        yield pool[i % 4]
        i += 1


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--report-dir", default=".")
    p.add_argument("--per", default="run")
    p.add_argument("--timeout-s", type=float, default=300.0, help="rendezvous and collective timeout")
    args = p.parse_args()

    plan = load_export()
    report = {"rank": plan.rank, "host": socket.gethostname(), "master_addr": os.environ.get("MASTER_ADDR"),
              "planned_host": plan.place.host, "stage": plan.place.stage}
    out = os.path.join(args.report_dir, f"user_rank{plan.rank}.json")
    with open(out, "w") as f:  # before the check, so a test sees where a misplaced rank ran
        json.dump(report, f)
    plan.check_host(strict=True)
    plan.select_device()
    deepspeed.init_distributed(dist_backend=plan.dist_backend, timeout=datetime.timedelta(seconds=args.timeout_s))
    torch.manual_seed(0)
    pipe = plan.pipeline_module(layer_specs(), loss_fn=nn.CrossEntropyLoss())
    engine, _, _, _ = deepspeed.initialize(model=pipe, model_parameters=[q for q in pipe.parameters()],
                                           config=plan.deepspeed_config(steps_per_print=10 ** 9))
    freq = plan.install_frequency_hook(engine)
    data = batches(plan.strategy["mbs"], seed=plan.place.replica)
    losses = []
    with plan.recorder(freq, warmup=args.warmup, per=args.per) as rec:
        for _ in range(args.warmup + args.iters):
            losses.append(float(rec.step(engine.train_batch, data_iter=data)))
    report.update(losses=losses, layers=[pipe._local_start, pipe._local_stop], backend=freq.backend,
                  instructions_ok=freq.hook.ok, mismatch=freq.hook.mismatch,
                  plan_steps=len(freq.hook.plan) if freq.hook.plan is not None else None,
                  applied_steps=freq.hook.applied_steps, iteration_s=rec.iteration_s, energy_j=rec.energy_j,
                  optimizer=optimizer_in_use(engine))
    with open(out, "w") as f:
        json.dump(report, f)
    dist.barrier()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown, where gloo's threads occasionally abort (as ampe's worker does)
