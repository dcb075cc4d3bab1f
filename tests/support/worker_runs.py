"""Real CPU trials of ampe's worker (torchrun, gloo, fp32 or bf16) and the cost model's memory for them: shared by the
worker's memory and tensor-parallel tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.strategy import strategy_from_dict
from ampe.costmodel.zoo import load_model

ROOT = Path(__file__).resolve().parents[2]


def launch(tmp_path: Path, strategy: dict, **job: Any) -> subprocess.CompletedProcess:
    """Run ampe's worker under torchrun on a job in ``tmp_path`` (gpt2-tiny, fp32, 2 warm-up and 3 timed
    iterations unless ``job`` says otherwise); the finished process."""
    world = strategy["pp"] * strategy["dp"] * strategy["tp"]
    spec = {"schema": "ampe.job/1", "trial_id": tmp_path.name, "model": "gpt2-tiny", "strategy": strategy,
            "frequency_plan": None, "freq_backend": "none", "gpu_types": ["cpu"] * world, "warmup_iters": 2,
            "timed_iters": 3, "seed": 0, "dtype": "fp32", "device": "cpu", "frozen_layers": 0,
            "out_dir": str(tmp_path), **job}
    (tmp_path / "job.json").write_text(json.dumps(spec))
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT)}
    return subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", str(world), "-m", "ampe.runtime.worker",
                           str(tmp_path / "job.json")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)


def run_trial(tmp_path: Path, strategy: dict, model: str = "gpt2-tiny", dtype: str = "fp32",
              attention: str | None = None, timed_iters: int = 3, **job: Any) -> list[dict]:
    """Run one trial in ``tmp_path`` (2 warm-up iterations, the last memory-traced); every rank's report."""
    proc = launch(tmp_path, strategy, model=model, dtype=dtype, attention=attention, timed_iters=timed_iters, **job)
    assert proc.returncode == 0, proc.stderr[-3000:]
    world = strategy["pp"] * strategy["dp"] * strategy["tp"]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


def predicted(strategy: dict, model: str = "gpt2-tiny", dtype: str | None = None,
              attention: str | None = None) -> list[float]:
    """Per-rank predicted allocated peak, bytes (the CPU trace counts tensors only); rank r runs stage
    r // (dp·tp), on this 2-core machine as a 2- or 4-device CPU cluster. ``dtype``, ``attention``: the model
    rebuilt at that precision, with that kernel."""
    m = load_model(model, attention, dtype)
    s = strategy_from_dict(strategy)
    spec = "local-cpu.yaml" if s.world_size <= 2 else "local-cpu-4.yaml"  # ranks time-share the cores
    cm = CostModel(load_cluster(ROOT / "cluster_specs" / spec), m)
    est = cm.estimate(s)
    s = est.strategy
    return [est.memory_breakdown[r // (s.dp * s.tp)].allocated for r in range(s.world_size)]
