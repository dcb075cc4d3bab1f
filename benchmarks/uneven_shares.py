"""Uneven data-parallel shares (issue 34): what they buy on mixed clusters, and what the choice costs.

For each spec: the whole search (ampe.search.engine.search) with ``shares="equal"`` and with ``shares="auto"``;
printed are the best plan's predicted iteration time under each (the gain of shares on the search's answer), the best
candidate whose replicas differ (where shares can act: its time under equal and under its best shares), and the
energy at equal time: the least energy of each best plan's frontier (Perseus, ampe.energy.strategy.plan_clocks)
within the equal-shares plan's iteration time. Then the CPU seconds of both searches (process time, the best of
``--repeat``), i.e. what the share choice costs.

Decisions: gbs and models as the issue's and the demo's examples (gpt2-amp with AMP's profile on AMP's cluster, gbs
32; gpt3-1.3b, gbs 64, elsewhere); the search's defaults otherwise (1F1B, eq5). Figures are predictions of ampe's
cost model; nothing here ran on GPUs.

Run: PYTHONPATH=. .venv/bin/python benchmarks/uneven_shares.py [--specs a,b] [--repeat N] [--no-energy]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.estimate import CostModel, Estimate
from ampe.costmodel.profile import load_profile
from ampe.costmodel.strategy import shares_label
from ampe.costmodel.zoo import load_model
from ampe.energy.strategy import plan_clocks
from ampe.search.engine import SearchOptions, SearchResult, search

ROOT = Path(__file__).resolve().parent.parent
AMP_PROFILE = ROOT / "ampe" / "data" / "amp_layer_profiles.csv"
CASES = {  # spec: (model, global batch, profile)
    "amp-het-cluster": ("gpt2-amp", 32, AMP_PROFILE),
    "mixed-a100-a40": ("gpt3-1.3b", 64, None),
    "mixed-h100-a100": ("gpt3-1.3b", 64, None),
    "a100-v100-replicas": ("gpt3-1.3b", 64, None),
    "h100-a40-replicas": ("gpt3-1.3b", 64, None),
}


def _timed_search(cluster, model, profile, gbs: int, shares: str, repeat: int) -> tuple[SearchResult, float]:
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.process_time()
        result = search(cluster, model, profile, SearchOptions(gbs=gbs, shares=shares))
        best = min(best, time.process_time() - t0)
    assert result is not None
    return result, best


def _shape(e: Estimate) -> str:
    s = e.strategy
    return f"pp{s.pp}/dp{s.dp}/tp{s.tp} mbs{s.mbs} gas {shares_label(s)}"


def _energy_within(cluster, est: Estimate, limit_s: float) -> float | None:
    """Least energy (J) of ``est``'s frontier within ``limit_s`` seconds of iteration, or None."""
    point = plan_clocks(est, cluster, max_time_s=limit_s).choose("energy", max_time_s=limit_s)
    return None if point is None else point.energy_j


def run_case(name: str, repeat: int, energy: bool) -> None:
    model_name, gbs, profile_path = CASES[name]
    cluster = load_cluster(ROOT / "cluster_specs" / f"{name}.yaml")
    model = load_model(model_name)
    profile = load_profile(profile_path) if profile_path else None
    equal, cpu_equal = _timed_search(cluster, model, profile, gbs, "equal", repeat)
    auto, cpu_auto = _timed_search(cluster, model, profile, gbs, "auto", repeat)
    e0, e1 = equal.ranked[0].estimate, auto.ranked[0].estimate
    gain = 100 * (1 - e1.iteration_s / e0.iteration_s)
    print(f"\n{name} ({cluster.size} GPUs), {model_name}, gbs {gbs}")
    print(f"  best, equal shares : {e0.iteration_s:.4f} s  {_shape(e0)}")
    print(f"  best, auto shares  : {e1.iteration_s:.4f} s  {_shape(e1)}   gain {gain:.1f} %")
    uneven = [c.estimate for c in auto.ranked if c.strategy.uneven]
    if uneven:
        u = uneven[0]
        cm = CostModel(cluster, model, profile)
        base = cm.estimate(replace(u.strategy, replica_gas=None))
        print(f"  best candidate with uneven shares: {u.iteration_s:.4f} s ({_shape(u)}) vs {base.iteration_s:.4f} s "
              f"under equal shares ({100 * (1 - u.iteration_s / base.iteration_s):.1f} % faster); "
              f"{len(uneven)} of {len(auto.ranked)} candidates took uneven shares")
    else:
        print(f"  no candidate took uneven shares ({len(auto.ranked)} candidates): every candidate's replicas are "
              "alike, or evening them out bought nothing")
    if energy:
        j0, j1 = _energy_within(cluster, e0, e0.iteration_s), _energy_within(cluster, e1, e0.iteration_s)
        if j0 is not None and j1 is not None:
            print(f"  energy within the equal-shares plan's time ({e0.iteration_s:.4f} s): equal {j0:.0f} J, "
                  f"auto {j1:.0f} J ({100 * (1 - j1 / j0):.1f} % less)")
    print(f"  search CPU s (best of {repeat}): equal {cpu_equal:.2f}, auto {cpu_auto:.2f} "
          f"(+{100 * (cpu_auto / cpu_equal - 1):.0f} %)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--specs", default=",".join(CASES), help="comma-separated spec names (default: all)")
    ap.add_argument("--repeat", type=int, default=1, help="searches per setting; the CPU time is the best")
    ap.add_argument("--no-energy", action="store_true", help="skip the energy at equal time")
    args = ap.parse_args()
    for name in args.specs.split(","):
        run_case(name, args.repeat, not args.no_energy)


if __name__ == "__main__":
    main()
