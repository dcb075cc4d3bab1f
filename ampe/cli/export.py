"""``ampe export``: write one strategy of a plan for the user's own DeepSpeed script (see docs/export.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ampe.cli._common import non_negative_int, positive_int


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a plan's strategy for your own training script (config, parts, hosts, "
                       "launch commands, clocks)",
                       description="Write strategy RANK of a plan to DIR: the DeepSpeed config, the pipeline parts "
                       "and rank → host/device map (export.json, read by ampe.runtime.load_export), a DeepSpeed "
                       "hostfile and .deepspeed_env, the launch commands (launch.sh for your script, "
                       "launch_worker.sh for ampe's worker), the frequency plan and a README of what to paste where.")
    p.add_argument("--plan", required=True, metavar="PLAN.json", help="plan file written by `ampe search --out`")
    p.add_argument("--rank", type=positive_int, default=1, metavar="R", help="plan rank to export (default 1)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write (created; files are overwritten)")
    p.add_argument("--script", default=None, metavar="SCRIPT.py|MODULE",
                   help="your training script (path, made absolute) or module; default train.py, which must then "
                   "be in the working folder")
    p.add_argument("--launcher", choices=("auto", "torchrun", "deepspeed"), default="auto",
                   help="auto: torchrun when every rank is on one node, else DeepSpeed's multi-node runner")
    p.add_argument("--freq-backend", choices=("auto", "nvml", "emulate", "none"), default="auto",
                   help="frequency backend the hook uses by default (auto: nvml on GPUs, emulate on CPUs, when the "
                   "plan has clocks)")
    p.add_argument("--host-map", metavar="HOSTS.yaml", help="cluster node name → hostname, for the hostfile")
    p.add_argument("--cluster", metavar="SPEC.yaml", help="cluster spec to launch on (default: the plan's)")
    p.add_argument("--master-port", type=positive_int, default=29500, metavar="PORT",
                   help="rendezvous port of the multi-node launch (default 29500)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"),
                   help="training precision (default fp32 on CPU, the model's on GPUs)")
    p.add_argument("--warmup", type=non_negative_int, default=2, metavar="N",
                   help="warm-up iterations of ampe's worker in launch_worker.sh (default 2)")
    p.add_argument("--iters", type=positive_int, default=5, metavar="N",
                   help="timed iterations of ampe's worker in launch_worker.sh (default 5)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ampe.trials.export import ExportOptions, export_plan
    from ampe.trials.hostfile import load_host_map

    options = ExportOptions(out_dir=Path(args.out), plan_rank=args.rank, script=args.script, launcher=args.launcher,
                            freq_backend=args.freq_backend, host_map=load_host_map(args.host_map),
                            cluster_spec=args.cluster, master_port=args.master_port, dtype=args.dtype,
                            warmup_iters=args.warmup, timed_iters=args.iters)
    done = export_plan(args.plan, options)
    e = done.export
    s = e.strategy
    print(f"ampe export: plan rank {e.plan_rank} (pp{s['pp']}·dp{s['dp']}·tp{s['tp']}·mbs{s['mbs']}) → {args.out}")
    print(f"  parts {e.parts}; {len(e.ranks)} ranks on {', '.join(h.host for h in e.hosts)}; launcher {e.launcher}"
          + (f", master {e.master_addr}:{e.master_port}" if e.launcher == "deepspeed" else ""))
    print(f"  files: {', '.join(sorted(done.files))}")
    print(f"  run: {done.files['launch.sh']}   (see {done.files['README.md']})")
    sys.stdout.flush()
    return 0
