"""Re-planning after a failure at 1,024 GPUs (issue 28): how long ``ampe replan --without NODE`` takes.

The old plan: ``make_plan`` for GPT-3 175B at global batch 1024 on 1,024 GPUs of three types (128 nodes of 8:
H100-80GB, A100-80GB and A100-40GB in thirds, :func:`benchmarks.support.scale_specs.three_types`), energy planning
off (not timed).
Then, each in a fresh process (its own CPU seconds and peak RSS), re-plans of its rank-1 strategy:

* ``--without`` the node of rank 0 (one node gone), ``--energy-planner none`` (time only) and with the default
  perseus (the old and the new strategy's clocks planned: two frontiers);
* ``--slow`` one device of rank 0 at factor 2 (a straggler);
* ``--without`` the node with ``--search`` (a whole search beside the warm start: how much the bounded
  neighbourhood leaves on the table);
* ``--without`` the node, then ``--add`` it back (from the re-planned plan).

Printed per run: CPU seconds of the re-plan itself (warm start + bounded search, in the library), of the energy
planning, of the whole process (imports, reading the plan and spec, writing), wall seconds, peak RSS, candidates
costed / ruled out, and the predicted change of the iteration time. Target (the issue's): ≤ 5 s CPU; the ratio
printed is the whole process's CPU seconds to it.

Last measured (2026-11-26 19:56 UTC, 2-core machine, load average about 2; CPU s of the re-plan / whole process):
without a node 0.13 / 0.94 (1.95 with perseus energy planning), a straggler 0.20 / 0.99, the node back 0.13 /
0.93, with ``--search`` 11.2 / 12.0 (same choice). docs/replan.md has the table.

Run: .venv/bin/python benchmarks/replan_speed.py [--gpus 1024]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.zoo import load_model
from ampe.formats.plan import PlanInputs
from ampe.io import write_json_atomic
from ampe.planning import PlanRequest, make_plan
from ampe.search.engine import SearchOptions
from benchmarks.support.scale_specs import three_types_yaml

TARGET_S = 5.0


def old_plan(folder: Path, gpus: int) -> tuple[Path, dict]:
    spec = folder / "cluster.yaml"
    spec.write_text(three_types_yaml(gpus))
    t0 = time.process_time()
    res = make_plan(load_cluster(spec), load_model("gpt3-175b"), None,
                    PlanRequest(SearchOptions(gbs=1024), energy_planner="none",
                                inputs=PlanInputs(cluster_spec=str(spec), model="gpt3-175b")))
    plan = folder / "plan.json"
    write_json_atomic(plan, res.plan.to_json())
    top = res.plan.strategies[0]
    print(f"old plan: {gpus} GPUs, pp/dp/tp {top.pp}/{top.dp}/{top.tp} mbs {top.mbs}, "
          f"{top.predicted.iteration_s:.3f} s/iter (search {time.process_time() - t0:.1f} CPU s, not timed below)")
    return plan, res.plan.to_json()


_RUN = ("import resource, sys\nfrom ampe.cli import main\nrc = main(sys.argv[1:])\n"
        "r = resource.getrusage(resource.RUSAGE_SELF)\nprint(f'RUSAGE {r.ru_utime + r.ru_stime} {r.ru_maxrss}')\n"
        "sys.exit(rc)\n")


def replan(argv: list[str]) -> dict:
    """One ``ampe replan`` in a fresh process: its printed figures, its CPU seconds and peak RSS."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _RUN, "replan", *argv], capture_output=True, text=True, cwd=ROOT,
                         check=False)
    if out.returncode:
        raise SystemExit(f"ampe replan {' '.join(argv)} failed: {out.stderr.strip()}")
    text = out.stdout
    m = re.search(r"re-planned in ([\d.]+) CPU s \(([\d.]+) s wall\); energy planning ([\d.]+) CPU s \(([\d.]+) s "
                  r"wall\); ([\d.]+) CPU s in all", text)
    c = re.search(r"(\d+) costed, (\d+) ruled out", text)
    t = re.search(r"time: ([\d.]+) → ([\d.]+) s/iter \(([-+\d.]+) %\)", text)
    u = re.search(r"RUSAGE ([\d.]+) (\d+)", text)
    assert m and c and t and u, text
    return {"replan_s": float(m[1]), "replan_wall_s": float(m[2]), "energy_s": float(m[3]), "lib_cpu_s": float(m[5]),
            "process_cpu_s": float(u[1]), "wall_s": time.perf_counter() - t0, "rss_mb": int(u[2]) / 1024,
            "costed": int(c[1]), "skipped": int(c[2]), "old_s": float(t[1]), "new_s": float(t[2]),
            "change_pct": float(t[3]), "moves": next((l for l in text.splitlines() if l.startswith("moves:")), "")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=1024)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        plan, doc = old_plan(folder, args.gpus)
        top = doc["strategies"][0]
        dev = doc["devices"][top["placement"][0]]
        node = dev["node"]
        runs = [
            (f"without {node}, time only", ["--plan", plan, "--without", node, "--energy-planner", "none",
                                            "--out", folder / "gone.json"]),
            (f"without {node}, perseus", ["--plan", plan, "--without", node, "--out", folder / "gone-e.json"]),
            (f"slow {dev['id']}=2, time only", ["--plan", plan, "--slow", f"{dev['id']}=2", "--energy-planner",
                                                "none", "--out", folder / "slow.json"]),
            (f"without {node}, --search", ["--plan", plan, "--without", node, "--energy-planner", "none", "--search",
                                           "--out", folder / "searched.json"]),
        ]
        print("CPU seconds: the re-plan itself, its energy planning, ampe's run from reading the plan, the whole "
              "process; wall seconds of the whole process; peak RSS of the process")
        print(f"{'re-plan':<34} | {'replan':>8} {'energy':>8} {'run':>8} {'process':>8} {'wall s':>7} "
              f"{'RSS MB':>7} | {'costed':>6} {'ruled out':>9} | {'s/iter':>15} | vs {TARGET_S:.0f} s")
        for i, (name, argv) in enumerate([*runs, ("", [])]):
            if i == len(runs):  # the node back, re-planned from the plan without it
                back = folder / "back.yaml"
                spec = yaml.safe_load((folder / "gone.cluster.yaml").read_text())
                group = next(g for g in spec["nodes"] if node.rpartition("-")[0] == g["name"])
                one = {k: v for k, v in group.items() if k != "repeat"}
                back.write_text(yaml.safe_dump({"nodes": [{**one, "name": node}]}))
                name, argv = f"{node} back (--add)", ["--plan", folder / "gone.json", "--add", back,
                                                      "--energy-planner", "none", "--out", folder / "back.json"]
            r = replan([str(a) for a in argv])
            out = Path(argv[argv.index("--out") + 1])
            chosen = json.loads(out.read_text())["strategies"][0]
            how = f"{chosen['pp']}/{chosen['dp']}/{chosen['tp']} {chosen['placement_name']}"
            print(f"{name:<34} | {r['replan_s']:8.2f} {r['energy_s']:8.2f} {r['lib_cpu_s']:8.2f} "
                  f"{r['process_cpu_s']:8.2f} {r['wall_s']:7.1f} {r['rss_mb']:7.0f} | {r['costed']:6d} "
                  f"{r['skipped']:9d} | {r['old_s']:6.3f}→{r['new_s']:6.3f} | "
                  f"{r['process_cpu_s'] / TARGET_S:4.2f}x   {how}; {r['moves']}")


if __name__ == "__main__":
    main()
