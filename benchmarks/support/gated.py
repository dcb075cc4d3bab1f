"""Trials for benchmarks on a shared machine: each trial starts only when the machine is quiet, and a trial during
which other processes still took CPU time is run again.

``run_gated(plan, options, gate)`` runs a plan's trials in predicted order with the runner's own pieces
(:func:`~ampe.trials.prepare.prepare`, :func:`~ampe.trials.runner.run_one`, the results folder), so the folder is an
ordinary ``ampe trial --out`` folder that ``ampe report`` reads. Before every attempt it waits on a
:class:`~benchmarks.support.quiet.QuietGate`; after it, the worker's ``host_other_cores`` (cores other processes kept
busy during the timed iterations) and a speed probe right after it (a virtual machine slows down when its host is
busy, which no counter inside shows) decide whether to try again (at most ``retries`` times); the least disturbed
attempt is the one kept. Every attempt's gate reading and load go to ``DIR/machine.jsonl``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from ampe.formats.trial import TrialResult
from ampe.io import write_json_atomic
from ampe.trials.launch import prebuild_op
from ampe.trials.prepare import TrialOptions, prepare, resolved_plan
from ampe.trials.results import ResultsStore
from ampe.trials.runner import run_one
from benchmarks.support.quiet import QuietGate


def other_cores(r: TrialResult) -> float | None:
    """Cores other processes kept busy during a trial's timed iterations (None when not measured)."""
    v = (r.worker or {}).get("host_other_cores")
    return float(v) if isinstance(v, (int, float)) else None


def run_gated(plan: str | Path, options: TrialOptions, gate: QuietGate, max_other_cores: float = 0.2,
              retries: int = 2, log: Callable[[str], None] = print) -> list[TrialResult]:
    """Run every trial of ``plan`` (top ``options.top_k``) behind ``gate``; returns the kept result per trial."""
    ctx, trials, _ = prepare(plan, options)
    prebuild_op(ctx)  # DeepSpeed's CPU op, once, before any rank starts (not inside the first trial's timeout)
    out = Path(options.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "plan.json", resolved_plan(ctx))
    store = ResultsStore(out)
    kept: list[TrialResult] = []
    for t in trials:
        best: TrialResult | None = None
        best_disturbance = float("inf")
        for attempt in range(retries + 1):
            reading = gate.wait()
            r = run_one(ctx, t, options.timeout_s)
            load = other_cores(r)
            after = gate.probe() / (gate.best_probe_s or 1.0)  # the machine's speed right after the trial
            with open(out / "machine.jsonl", "a") as f:
                f.write(json.dumps({"trial_id": t.trial_id, "attempt": attempt, "gate": asdict(reading),
                                    "host_other_cores": load, "slowdown_after": after, "status": r.status}) + "\n")
            disturbance = (load or 0.0) + max(0.0, after - 1.0)
            if best is None or (r.status == "ok" and (best.status != "ok" or disturbance < best_disturbance)):
                best, best_disturbance = r, disturbance
            if r.status != "ok" or ((load is None or load <= max_other_cores) and after <= gate.max_slowdown):
                break
            log(f"  {t.trial_id}: disturbed (other processes {load if load is None else round(load, 2)} cores, "
                f"machine {after:.2f}× slower than its best right after); again")
        assert best is not None
        store.append(best)
        kept.append(best)
        log(f"  {t.trial_id}: {best.status} {best.iteration_s_mean or 0:.4f} s/iter (predicted "
            f"{t.predicted_s:.4f}), other load {other_cores(best) if other_cores(best) is not None else 'n/a'}")
    store.write_summary([], {"plan": str(plan), "gated": True})
    return kept
