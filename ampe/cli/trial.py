"""``ampe trial``: run the top strategies of a plan as real training trials (resumable; see docs/trials.md)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from ampe.cli._common import non_negative_int, positive_float, positive_int, print_table
from ampe.formats.trial import TrialResult
from ampe.trials.commands import LAUNCHERS
from ampe.trials.hostfile import UnrealizablePlacementError, load_host_map
from ampe.trials.launch import build_launch
from ampe.trials.prepare import FREQ_BACKENDS, TrialOptions, prepare
from ampe.trials.progress import describe, make_view
from ampe.trials.runner import TrialsInterrupted, run_trials
from ampe.trials.stop import StopRequests
from ampe.units import si

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B?)\s*$", re.I)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trial", help="run the plan's top strategies as real trials and record what they measure",
                       description="Launch the top-k strategies of a plan in predicted order (torchrun on one host, "
                       "the DeepSpeed launcher across hosts), with a per-trial timeout, an overall budget, and "
                       "out-of-memory/crash/hang detection. Results are appended to DIR/results.jsonl as each trial "
                       "finishes; rerunning the same command resumes and skips finished trials. Ctrl-C stops "
                       "cleanly (exit 130).")
    p.add_argument("--plan", required=True, metavar="PLAN.json", help="plan file written by `ampe search --out`")
    p.add_argument("--top-k", type=positive_int, default=10, metavar="K",
                   help="strategies to run, best predicted first (default 10, as AMP)")
    p.add_argument("--budget", type=positive_float, default=None, metavar="SECONDS",
                   help="wall-clock budget for this run's trials; a trial expected to overrun it is skipped. With a "
                   "budget the order is adaptive: after each measured trial the cost model is calibrated on what "
                   "was measured and the predicted best of the rest runs next; the run stops early when none can "
                   "beat the best measured one by more than the model's error (docs/trials.md)")
    p.add_argument("--plan-order", action="store_true",
                   help="with --budget, keep the plan's predicted order (no adaptive re-ranking)")
    p.add_argument("--freq-backend", choices=FREQ_BACKENDS, default="auto",
                   help="how frequency schedules are applied: nvml (real GPU clocks), emulate (modelled stretch "
                   "and energy), none; auto = nvml on GPUs, emulate on CPUs when the plan has schedules")
    p.add_argument("--out", metavar="DIR", help="results folder (default runs/<plan name>)")
    p.add_argument("--timeout", type=positive_float, default=600.0, metavar="S",
                   help="per-trial limit in seconds (default 600); a trial still running then is killed")
    p.add_argument("--warmup", type=non_negative_int, default=3, metavar="N", help="warm-up iterations (default 3)")
    p.add_argument("--iters", type=positive_int, default=10, metavar="N", help="timed iterations (default 10)")
    p.add_argument("--launcher", choices=("auto", *LAUNCHERS), default="auto",
                   help="auto: torchrun when all ranks are on one node, else deepspeed; torchrun/local run every "
                   "rank on this host even for a multi-node spec")
    p.add_argument("--memory-limit", type=_size, default=None, metavar="SIZE",
                   help="per-rank address-space limit for CPU trials, e.g. 6G (RLIMIT_AS; torch alone maps a few GiB)")
    p.add_argument("--cluster", metavar="SPEC.yaml", help="cluster spec to launch on (default: the plan's)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), help="training precision (default fp32 on CPU, "
                   "the model's on GPUs)")
    p.add_argument("--retry-failed", action="store_true",
                   help="rerun trials recorded as crash, killed or timeout (ok and oom are kept)")
    p.add_argument("--run-unfit", action="store_true", help="also run strategies predicted not to fit in memory")
    p.add_argument("--no-baseline", action="store_true",
                   help="with a frequency schedule, do not also run the strategy without it")
    p.add_argument("--startup-s", type=positive_float, default=30.0, metavar="S",
                   help="first guess of a trial's start-up time for the budget (refined by measurements)")
    p.add_argument("--model", metavar="MODEL",
                   help="train this model instead of the plan's (as many layers; every prediction redone for it "
                   "without the plan's profile), e.g. gpt2-amp-mini to try the demo plan on this machine's CPU")
    p.add_argument("--host-map", metavar="HOSTS.yaml",
                   help="cluster node name → hostname, for the DeepSpeed hostfile")
    p.add_argument("--worker", default="ampe.runtime.worker", metavar="MODULE|SCRIPT.py",
                   help="worker to launch (default ampe.runtime.worker)")
    p.add_argument("--no-prebuild", action="store_true",
                   help="CPU trials: do not build DeepSpeed's CPU comm op before the first trial (for a --worker that "
                   "does not start DeepSpeed); stale build locks are still cleared")
    p.add_argument("--emulate-speed", action="store_true",
                   help="CPU trials: ranks of slower device types stretch every forward/backward by their type's "
                   "speed ratio to the fastest type of the cluster (peak FLOP/s), to emulate a mixed cluster")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed passed to the worker (default 0)")
    p.add_argument("--progress", choices=("auto", "plain", "none"), default="auto",
                   help="progress display on stderr (auto: live bar on a terminal, lines otherwise)")
    p.add_argument("--dry-run", action="store_true", help="print the trials and their commands; run nothing")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ampe.io import check_output_folder

    if args.out is None:  # the default folder is named after the plan: its name must make a usable folder too
        check_output_folder(Path("runs") / Path(args.plan).stem, "--out (default runs/<plan name>)")
        args.out = str(Path("runs") / Path(args.plan).stem)
        from ampe.cli._paths import check_paths

        check_paths(args)  # the default folder may not hold an input either (runs/p/plan.json as --plan)
    options = TrialOptions(
        out_dir=Path(args.out),
        top_k=args.top_k, budget_s=args.budget, freq_backend=args.freq_backend, timeout_s=args.timeout,
        warmup_iters=args.warmup, timed_iters=args.iters, launcher=args.launcher,
        memory_limit_bytes=args.memory_limit, startup_s=args.startup_s, worker=args.worker,
        retry_failed=args.retry_failed, run_unfit=args.run_unfit, baseline=not args.no_baseline, dtype=args.dtype,
        seed=args.seed, emulate_speed=args.emulate_speed, cluster_spec=args.cluster, model=args.model,
        host_map=load_host_map(args.host_map), prebuild=not args.no_prebuild,
        rerank=_adaptive() if args.budget is not None and not args.plan_order else None)
    if args.dry_run:
        return _dry_run(args.plan, options)
    view = make_view(args.progress)
    # Signals are stop requests for the whole command, not only while a trial runs: the runner's handler takes over
    # during the trials and hands back to this one, so a late second Ctrl-C/SIGTERM cannot cut the shutdown short.
    with StopRequests() as stop:
        return _run(args, options, view, stop)


def _adaptive() -> Any:
    from ampe.report.adaptive import calibrated_reranker

    return calibrated_reranker()


def _run(args: argparse.Namespace, options: TrialOptions, view: Any, stop: StopRequests) -> int:
    try:
        results = run_trials(args.plan, options, view, stop)
    except TrialsInterrupted as stop:
        _print_results(stop.results, options.out_dir)
        sys.stderr.write(f"ampe trial: interrupted; finished trials are kept in {options.out_dir} (rerun the same "
                         "command to resume)\n")
        return 130
    _print_results(results, options.out_dir)
    ran = [r for r in results if r.status not in ("skipped",)]
    if ran and not any(r.status == "ok" for r in ran):
        sys.stderr.write("ampe trial: no trial measured successfully\n")
        return 1
    return 0


def _print_results(results: list[TrialResult], out: Path) -> None:
    rows = []
    for r in results:
        pred = f"{r.predicted_iteration_s:.4f}" if r.predicted_iteration_s else ""
        meas = f"{r.iteration_s_mean:.4f}" if r.iteration_s_mean is not None else ""
        err = (f"{(r.predicted_iteration_s - r.iteration_s_mean) / r.iteration_s_mean * 100:+.1f}"
               if r.iteration_s_mean and r.predicted_iteration_s else "")
        energy = "" if r.energy_j_per_iter is None else (
            f"{si(r.energy_j_per_iter, 'J')} ({'nvml' if r.energy_measured else 'modelled'})")
        rows.append([r.plan_rank, r.label(), r.freq_backend, r.status, pred, meas, err, energy,
                     "" if r.status == "ok" else (r.reason or "")])
    print_table(f"ampe trial: {len(results)} trial{'' if len(results) == 1 else 's'} (results in {out})",
                ["rank", "strategy", "freq", "status", "pred s/iter", "meas s/iter", "err %", "energy/iter (source)",
                 "reason"], rows)


def _dry_run(plan: str, options: TrialOptions) -> int:
    ctx, trials, left_out = prepare(plan, options)
    for r in left_out:
        print(describe(r))
    for t in trials:
        job = str(Path(options.out_dir) / "trials" / t.trial_id / "job.json")
        try:
            launch = build_launch(ctx, t, job)
            line = f"{launch.kind}: {' '.join(launch.argv)}"
            if launch.hostfile:
                line += "\n  hostfile: " + launch.hostfile.strip().replace("\n", "; ")
        except UnrealizablePlacementError as e:
            line = f"cannot launch: {e}"
        print(f"{t.trial_id}: predicted {t.predicted_s:.4g} s/iter\n  {line}")
    return 0


def _size(text: str) -> int:
    """argparse type: bytes with an optional K/M/G/T suffix (powers of 1024), e.g. 512M, 6G, 6GiB."""
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 512M, 6G)")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    value = int(float(m.group(1)) * scale)
    if value < 1 << 20:
        raise argparse.ArgumentTypeError(f"{text!r} is below 1 MiB; no process starts under that")
    return value

