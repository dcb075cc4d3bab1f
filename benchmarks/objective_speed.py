"""The priced objective against the time objective at scale (issue 37): ``ampe search --objective cost`` and
``--objective time`` on 1,024 GPUs of three types (``benchmarks/support/scale_specs.py``) with each type in its own
priced site, Llama-3.1-405B, default global batch, top 10, one fresh process each. Prints CPU seconds (user + system
of that process: what a loaded machine does not inflate), wall seconds and peak RSS, and cost / time (target ≤ 1.5).

Last measured (2026-11-28, 2-core machine shared with four other jobs; CPU s / peak RSS): before issue 37's
Objective (main 262ead9 + the trade-off core move) time 177.7 s / 1419 MB (load ≈ 11), cost 465.4 s / 2284 MB
(load ≈ 2): 2.6×; after, time 186.7 s / 1401 MB and cost 521.2 s / 2294 MB (load 12.7 at the start): 2.8×. The
refactor changes no work; cost traces every frontier within the bound as energy does, so the 1.5× target is not met.

The priced branch and bound (docs/energy.md §10, ``rank_strategies(bound_prices=True)``) skips only strategies that
cannot reach the top k; at 1,024 GPUs at most 7 strategies are within 5 % of the fastest (the budget's count), all
of them in the default top 10, so it skips nothing there and the figures above stand (no exact pruning reaches the
target at that k). Nor at ``--top-k 3`` (2026-11-28, load ≈ 4, `ampe search ... --objective cost --top-k 3` by
/usr/bin/time, this branch against main b735fc5 side by side): 650.2 s CPU / 2.21 GB with the bound, 660.7 s /
2.20 GB without, identical plans (7 within the bound, screened, 6 planned): the top three cost 27.27, 27.59 and
27.74 USD per iteration, electricity is about 3 % of that, so every floor stays below the 6th screened score and
the 3rd ceiling; ``--objective time --top-k 3`` took 121.5 s CPU / 1.15 GB (cost / time 5.4×). The bound pays
where rent separates strategies more than energy does (gpt2-amp on amp-het-priced.yaml, 30 % bound, top 1: 6 of 8
screens skipped, the ranking 2.0 s against 5.0 s).

The cost window and ``--priced-direct`` (2026-11-28, this benchmark, ``time`` and ``cost+direct`` in two processes side
by side, load average 0.2-1.3; CPU s / peak RSS): ``time`` 133.6 s / 1.45 GB, ``cost --priced-direct`` 158.5 s /
2.05 GB: 1.19x; plain ``cost`` right after (load 0.9) 449.7 s / 2.26 GB, 3.4x, its plan's ten strategy entries
identical to the direct mode's. Without the flag the plans, and the work, are unchanged: no exact pruning of the
trace exists (docs/energy.md §10.9, "Why the window does not make the traced path fast, exactly").

The per-strategy default (``--priced-path auto``: a strategy keeps its trace where the work estimate puts it at most
1 CPU s, docs/energy.md §10.9; 2026-11-28, ``time`` then ``cost``, load average 2.8 at the start, 1.4 at the end):
``time`` 114.7 s / 1.41 GB, ``cost`` 152.8 s / 2.04 GB: 1.33x, the seven strategies within the bound solved directly
(each trace estimated at 7 s or more at the τ coarsened 7.9x there; four of them also at the bound's end, which cuts
their cost windows), the three beyond at their T_min points. ``cost+traced`` (load 7-11): 588.5 s / 2.32 GB; the ten
strategy entries of both plans identical (``predicted.cost.direct`` aside).

Re-measured on main 6337c03's parent (bc8f83b, 2026-11-28 22:41-22:50 UTC; load average 0.3 at the start, one short
test run beside ``time``): ``time`` 138.5 s / 1.41 GB, ``cost`` 175.1 s / 2.03 GB (1.26x), ``carbon`` 177.4 s /
2.04 GB (1.28x). On main dd30cba (2026-11-29 00:35-00:39 UTC, load average 0.5, nothing else running): ``cost``
103.3 s / 2.03 GB, ``time`` 88.5 s / 1.40 GB (1.17x; ``time`` alone a few minutes before: 80.8 s). The work estimate
now counts the seven strategies solved directly by their LPs, so τ is no longer coarsened 7.9x under ``cost`` (the
same points; docs/energy.md §10.9).

Run: PYTHONPATH=$PWD .venv/bin/python benchmarks/objective_speed.py [--gpus 1024] [--objectives time,cost] [--top-k 10]
(``cost+direct``, ``cost+traced`` in ``--objectives``: ``--objective cost --priced-path direct`` / ``traced``.)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.search_scaling import _measured
from benchmarks.support.scale_specs import three_types

MODEL = "llama-3.1-405b"
# per GPU type: rent (per GPU-hour), electricity (per kWh), carbon (g per kWh), PUE: illustrative, one site each
SITES = {"H100-80GB": (2.5, 0.09, 45, 1.1), "A100-80GB": (1.6, 0.12, 250, 1.3), "A100-40GB": (1.1, 0.21, 420, 1.4)}


def priced_yaml(n: int) -> str:
    """:func:`three_types` with each GPU type at its own priced site, as YAML text."""
    spec = three_types(n)
    lines = [f"name: {spec['name']}-priced", "currency: USD", "nodes:"]
    for node in spec["nodes"]:
        rent, kwh, carbon, pue = SITES[node["gpu"]]
        node = {**node, "price_per_hour": rent, "electricity_per_kwh": kwh, "carbon_g_per_kwh": carbon, "pue": pue}
        lines.append("  - {" + ", ".join(f"{k}: {v}" for k, v in node.items()) + "}")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--objectives", default="time,cost")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--keep", type=Path, default=None, metavar="DIR", help="write the plans there (default: nowhere)")
    args = ap.parse_args()
    print(f"ampe search, {args.gpus} GPUs (three types, priced sites), {MODEL}, top {args.top_k}; load average "
          f"{os.getloadavg()[0]:.1f} at the start")
    cpu_of = {}
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.keep or scratch
        spec = Path(tmp) / "priced.yaml"
        spec.write_text(priced_yaml(args.gpus))
        for name in args.objectives.split(","):
            objective, _, path = name.partition("+")  # cost+direct, cost+traced: with --priced-path
            cmd = [sys.executable, "-m", "ampe", "search", "--cluster", str(spec), "--model", MODEL,
                   "--objective", objective, "--top-k", str(args.top_k), "--out", str(Path(tmp) / f"{name}.json"),
                   *(["--priced-path", path] if path else [])]
            code, cpu, wall, rss, tail = _measured(cmd, args.timeout)
            cpu_of[name] = cpu
            print(f"--objective {name:>12}: exit {code}, {cpu:6.1f} s CPU, {wall:6.1f} s wall, "
                  f"{rss / 1e6:5.0f} MB peak RSS" + (f" ({tail})" if code else ""), flush=True)
    for name in (n for n in cpu_of if n != "time" and "time" in cpu_of):
        print(f"{name} / time: {cpu_of[name] / cpu_of['time']:.2f}x CPU (target ≤ 1.5x)")


if __name__ == "__main__":
    main()
