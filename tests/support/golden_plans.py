"""The plans the bundled cluster specs produce, as stored in tests/data/golden_plans.json (the no-behaviour-change
guard of tests/test_regression_guard_plans.py).

Each case is a bundled spec (cluster_specs/*.yaml) with the small model and objective it is used with in tests and
docs, at global batch 8 (the AMP model cluster at 32) and top 2, so that all of them take seconds. What is stored is
the whole plan document (strategies, energy, cost, DeepSpeed configs) less what changes from run to run (the time it
was made, the version, the seconds the search and the energy planning took).

Regenerate (after a change that alters plans on purpose; say why in the commit)::

    PYTHONPATH=$PWD .venv/bin/python -m tests.support.golden_plans
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden_plans.json"
AMP_PROFILE = "ampe/data/amp_layer_profiles.csv"

# (case id, spec, model, profile, global batch, objective, pipeline degrees kept or None)
CASES: tuple[tuple[str, str, str, str | None, int, str, tuple[int, ...] | None], ...] = (
    ("local-cpu/energy", "local-cpu.yaml", "gpt2-tiny", None, 8, "energy", None),
    ("local-cpu-4/time", "local-cpu-4.yaml", "gpt2-tiny", None, 8, "time", None),
    ("amp-het-cluster/time", "amp-het-cluster.yaml", "gpt2-amp", AMP_PROFILE, 8, "time", None),
    ("amp-het-priced/cost", "amp-het-priced.yaml", "gpt2-amp", AMP_PROFILE, 8, "cost", (4,)),
    ("amp-het-priced/carbon", "amp-het-priced.yaml", "gpt2-amp", AMP_PROFILE, 8, "carbon", (2,)),
    ("amp-het-model/time", "amp-het-model.yaml", "gpt2-amp", AMP_PROFILE, 32, "time", None),
    ("amp-homogeneous/edp", "amp-homogeneous.yaml", "gpt2-amp", AMP_PROFILE, 8, "edp", None),
    ("consumer-mixed-1g/time", "consumer-mixed-1g.yaml", "gpt2-medium", None, 8, "time", None),
    ("mixed-a100-a40/energy", "mixed-a100-a40.yaml", "gpt2-medium", None, 8, "energy", None),
    ("mixed-h100-a100/time", "mixed-h100-a100.yaml", "gpt3-1.3b", None, 8, "time", None),
    ("perseus-a40-8/energy", "perseus-a40-8.yaml", "gpt3-2.7b", None, 8, "energy", None),
    ("perseus-a40-16/time", "perseus-a40-16.yaml", "gpt3-6.7b", None, 8, "time", None),
)
IDS = tuple(case[0] for case in CASES)
MAX_SLOWDOWN = 0.05  # every objective but time: the bound the stored plans were made with
TOP_K = 2


def _stable(doc: dict[str, Any]) -> dict[str, Any]:
    """The plan document less what differs between two runs of the same code."""
    doc = {k: v for k, v in doc.items() if k not in ("created", "ampe_version")}
    search = dict(doc["search"])
    search.pop("seconds", None)
    if isinstance(search.get("energy"), dict):
        search["energy"] = {k: v for k, v in search["energy"].items() if k != "seconds"}
    doc["search"] = search
    return doc


def plan_of(case_id: str) -> dict[str, Any]:
    """The stable plan document the current code makes for one case (seconds each)."""
    from ampe.costmodel.cluster import load_cluster
    from ampe.costmodel.profile import load_profile
    from ampe.costmodel.zoo import load_model
    from ampe.planning import PlanRequest, make_plan
    from ampe.search.engine import SearchOptions

    _, spec, model, profile, gbs, objective, degrees = CASES[IDS.index(case_id)]
    request = PlanRequest(search=SearchOptions(gbs=gbs, top_k=TOP_K), objective=objective,
                          max_slowdown=None if objective == "time" else MAX_SLOWDOWN, pipeline_degrees=degrees)
    made = make_plan(load_cluster(ROOT / "cluster_specs" / spec), load_model(model),
                     load_profile(ROOT / profile) if profile else None, request)
    return _stable(json.loads(json.dumps(made.plan.to_json())))


def main() -> None:
    """Write every case's plan to :data:`GOLDEN`."""
    plans = {case_id: plan_of(case_id) for case_id in IDS}
    GOLDEN.write_text(json.dumps(plans, indent=1, sort_keys=True) + "\n")
    print(f"{len(plans)} plans written to {GOLDEN.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
