"""A user's training script under an exported plan, training ampe's own layers of the plan's model (what
``benchmarks/gpu_check.sh`` runs after ``ampe export``; launched by the export's ``launch.sh``).

Everything comes from the export: the layers (``plan.model_layer_specs()``: the plan's attention kernel, sharded at
tp > 1) and their loss (``plan.model_loss()``: vocab-parallel at tp > 1), the
partition and recomputation (``plan.pipeline_module``), the DeepSpeed config with the plan's optimizer, the device.
Synthetic token batches; the recorder appends the measurements line ``ampe report --measurements`` reads. Rank 0
writes ``--report``: the optimizer DeepSpeed built, the attention kernel torch ran and the losses.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import deepspeed
import torch
import torch.distributed as dist

from ampe.costmodel.zoo import load_model
from ampe.runtime import load_export
from ampe.runtime.attention import kernel_ran
from ampe.runtime.pipeline import optimizer_in_use
from ampe.runtime.replicas import replica_batches


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--report", default="user_script.json")
    args = p.parse_args()

    plan = load_export()
    plan.select_device()
    deepspeed.init_distributed(dist_backend=plan.dist_backend)
    torch.manual_seed(0)
    pipe = plan.pipeline_module(plan.model_layer_specs(), loss_fn=plan.model_loss())
    params = [q for q in pipe.parameters() if q.requires_grad]
    engine, _, _, _ = deepspeed.initialize(model=pipe, model_parameters=params, config=plan.deepspeed_config())
    model = load_model(plan.file.model)
    # this replica's own slice of each iteration's samples (its share under uneven shares)
    data = replica_batches(model.vocab, model.seq_len, plan.strategy["mbs"], 0, plan.shares, plan.place.replica)
    losses = []
    with plan.recorder(warmup=args.warmup) as rec:
        for _ in range(args.warmup + args.iters):
            losses.append(float(rec.step(engine.train_batch, data_iter=data)))
    if plan.rank == 0:
        with open(args.report, "w") as f:
            json.dump({"optimizer": optimizer_in_use(engine), "attention": plan.attention,
                       "attention_kernel": kernel_ran(), "losses": losses, "iteration_s": rec.iteration_s,
                       "strategy": plan.strategy}, f, indent=1)
    dist.barrier()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown, where gloo's threads occasionally abort (as ampe's worker does)
