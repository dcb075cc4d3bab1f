"""Helpers for the runner and report tests: tiny plans for a 2-device CPU cluster and the fake worker."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ampe.costmodel.strategy import uniform_partition
from ampe.costmodel.zoo import load_model
from ampe.trials.prepare import TrialOptions

HERE = Path(__file__).resolve().parent
FAKE_WORKER = str(HERE / "fake_worker.py")
MODEL = "gpt2-tiny"
CLUSTER_YAML = """name: cpu2
nodes:
  - {name: host, gpu: cpu, count: 2, intra_gbps: 40, inter_gbps: 40}
"""


def strategy(rank: int, pp: int, dp: int, mbs: int, predicted_s: float, *, gbs: int = 8, tp: int = 1,
             fits: bool = True, memory: int = 100_000_000, frequency_plan: dict | None = None) -> dict[str, Any]:
    """One plan entry shaped like `ampe search` writes it."""
    layers = load_model(MODEL).num_layers
    entry = {"rank": rank, "pp": pp, "dp": dp, "tp": tp, "mbs": mbs, "gbs": gbs, "gas": gbs // (dp * mbs),
             "placement": list(range(pp * dp * tp)), "partition": list(uniform_partition(layers, pp)),
             "schedule": "1f1b",
             "predicted": {"iteration_s": predicted_s, "samples_per_s": gbs / predicted_s, "max_memory_bytes": memory,
                           "memory_bytes_per_stage": [memory] * pp, "fits": fits},
             "deepspeed": {"train_batch_size": gbs, "train_micro_batch_size_per_gpu": mbs,
                           "gradient_accumulation_steps": gbs // (dp * mbs)}}
    if frequency_plan is not None:
        entry["frequency_plan"] = frequency_plan
    return entry


def write_plan(tmp: Path, strategies: list[dict], name: str = "plan.json") -> Path:
    """A plan file plus its cluster spec in ``tmp``; returns the plan path."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "cluster.yaml").write_text(CLUSTER_YAML)
    plan = {"schema": "ampe.plan/1", "cluster": "cpu2", "model": MODEL, "global_batch": 8,
            "inputs": {"cluster_spec": str(tmp / "cluster.yaml"), "model": MODEL, "profile": None},
            "search": {"candidates": len(strategies), "pruned_oom": 0, "seconds": 0.0}, "strategies": strategies}
    path = tmp / name
    path.write_text(json.dumps(plan, indent=1))
    return path


def four_strategies() -> list[dict]:
    """Four distinct strategies of the 2-device cluster (keys pp2dp1tp1mbs1, pp2dp1tp1mbs2, pp1dp2tp1mbs1,
    pp1dp2tp1mbs4 for the fake worker's control)."""
    return [strategy(1, 2, 1, 1, 0.02), strategy(2, 2, 1, 2, 0.03), strategy(3, 1, 2, 1, 0.05),
            strategy(4, 1, 2, 4, 0.04)]


def options(out: Path, **kw: Any) -> TrialOptions:
    """Fast options: fake worker, local launcher, few iterations, short timeouts; DeepSpeed's op is not built (the
    fake worker does not start DeepSpeed), but dead builders' locks are still cleared before each trial."""
    base = dict(out_dir=out, worker=FAKE_WORKER, launcher="local", warmup_iters=1, timed_iters=3, timeout_s=20.0,
                kill_grace_s=2.0, fail_grace_s=0.5, poll_s=0.05, prebuild=False)
    base.update(kw)
    return TrialOptions(**base)


def control(**per_strategy: dict) -> dict[str, str]:
    """The environment that tells the fake worker how to misbehave."""
    return {"AMPE_FAKE_CONTROL": json.dumps(per_strategy)}


def processes_mentioning(text: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line contains ``text``."""
    import psutil

    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and any(text in a for a in (p.info["cmdline"] or [])):
                out.append(p.info["pid"])
        except psutil.Error:
            pass
    return [pid for pid in out if pid != os.getpid()]


def fake_ranks(out: Path) -> list[int]:
    """Pids of the fake worker's ranks of trials in ``out``: ``python [-u] fake_worker.py JOB`` (not a guard or a
    launcher naming it later in its command line)."""
    import psutil

    found = []
    for pid in processes_mentioning(str(out)):
        try:
            if FAKE_WORKER in psutil.Process(pid).cmdline()[1:3]:
                found.append(pid)
        except psutil.Error:
            pass
    return found
