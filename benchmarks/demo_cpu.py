"""CPU seconds of ``make demo``'s search (issue 34's target: ≤ 3.85 s CPU with energy planning).

The command is the Makefile's: ``ampe search --cluster cluster_specs/amp-het-cluster.yaml --model gpt2-amp --profile
ampe/data/amp_layer_profiles.csv --global-batch 32 --top-k 10 --out PLAN``, each run a fresh process; its figure is
the user + system CPU seconds of the whole process (imports included), from ``getrusage(RUSAGE_CHILDREN)``.

Two ways of starting, both printed: ``cached`` (every module's bytecode already compiled, as for a user from the
second ``ampe`` run on: ``PYTHONPYCACHEPREFIX`` points at a folder of this script's, filled by one run that is not
counted) and ``source`` (``PYTHONDONTWRITEBYTECODE=1``, as this project's shared environment sets it: the installed
packages' bytecode is read from their own caches, and ampe's modules, whose checkouts there hold none, are compiled
from source in every run; a checkout with ``__pycache__`` folders in it makes this ``cached`` again, and the script
says so). With ``--baseline DIR`` (another checkout, e.g. a ``/tmp`` copy of main), its runs alternate with this
checkout's, so that both see the same load, and the plans of both are compared (equal apart from the creation
time, the input paths and the timings). The load average is printed per run: on the shared 2-core machine the
same run takes ±15 % CPU between quiet and loaded moments, so only alternating pairs compare.

Last measured: docs/shares.md, "The demo's CPU seconds".

Run: .venv/bin/python benchmarks/demo_cpu.py [--runs 5] [--baseline /tmp/main-copy]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 3.85
DEMO = ("search", "--cluster", "cluster_specs/amp-het-cluster.yaml", "--model", "gpt2-amp", "--profile",
        "ampe/data/amp_layer_profiles.csv", "--global-batch", "32", "--top-k", "10")
# what differs between runs or checkouts: the creation time, the input paths (relative to the plan), the timings
VOLATILE = (("created",), ("inputs", "cluster_spec"), ("inputs", "profile"), ("search", "seconds"),
            ("search", "energy", "seconds"))


def run_demo(checkout: Path, plan: Path, cache: Path | None) -> float:
    """CPU seconds (user + system) of one ``ampe search`` of the demo in ``checkout``, writing ``plan``.

    Args:
        checkout: the repository root whose ``ampe`` runs (put first on ``PYTHONPATH``).
        plan: where the plan goes.
        cache: the bytecode cache folder (``PYTHONPYCACHEPREFIX``), or None: no bytecode written, the packages' own
            caches read (``source``, module docstring).

    Returns:
        The process's CPU seconds.
    """
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PYTHONPYCACHEPREFIX", None)
    if cache is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env["PYTHONPYCACHEPREFIX"] = str(cache)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "ampe", *DEMO, "--out", str(plan)], cwd=checkout, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def stable(plan: dict) -> dict:
    """``plan`` (a plan's JSON) without the fields that differ between runs and checkouts (:data:`VOLATILE`)."""
    out = json.loads(json.dumps(plan))
    for path in VOLATILE:
        parent = out
        for key in path[:-1]:
            parent = parent.get(key, {})
        parent.pop(path[-1], None)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per checkout and way of starting (default 5)")
    parser.add_argument("--baseline", type=Path, help="another checkout to alternate with (e.g. a copy of main)")
    args = parser.parse_args()
    checkouts = {"this": ROOT} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    with tempfile.TemporaryDirectory(prefix="ampe-demo-cpu-") as tmp:
        folder = Path(tmp)
        figures: dict[tuple[str, str], list[float]] = {}
        for name, checkout in checkouts.items():  # fill the bytecode caches (not counted)
            if any((checkout / "ampe").rglob("__pycache__")):
                print(f"{name}: {checkout / 'ampe'} holds __pycache__ folders: 'source' reads them (as 'cached')")
            run_demo(checkout, folder / f"{name}.json", folder / f"pyc-{name}")
        for i in range(args.runs):
            for way in ("cached", "source"):
                for name, checkout in checkouts.items():
                    load = os.getloadavg()[0]
                    cache = folder / f"pyc-{name}" if way == "cached" else None
                    cpu = run_demo(checkout, folder / f"{name}.json", cache)
                    figures.setdefault((name, way), []).append(cpu)
                    print(f"run {i + 1} {way:6} {name:8} {cpu:5.2f} s CPU  (load average {load:.1f})", flush=True)
        for (name, way), cpus in figures.items():
            print(f"{name:8} {way:6} median {statistics.median(cpus):.2f} s CPU, {min(cpus):.2f}–{max(cpus):.2f} "
                  f"over {len(cpus)} runs (target {TARGET_S} s)")
        if args.baseline:
            plans = [stable(json.loads((folder / f"{name}.json").read_text())) for name in checkouts]
            print("plans equal apart from times and paths:", "yes" if plans[0] == plans[1] else "NO")


if __name__ == "__main__":
    main()
