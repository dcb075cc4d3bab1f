"""`ampe search`: DP-optimal partitions per placement, memory pruning, joblib backends, plan JSON + schema."""

from __future__ import annotations

import itertools
import json

import jsonschema
import pytest

from ampe.costmodel.cluster import cluster_from_dict, load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.profile import load_profile
from ampe.costmodel.strategy import Strategy
from ampe.costmodel.zoo import load_model
from ampe.formats.plan import PlanFile, plan_json_schema
from ampe.search.engine import SearchOptions, best_for_placement, search
from ampe.search.space import Degrees, enumerate_degrees
from tests.conftest import AMP_PROFILE, SPECS
from tests.support.plans import validate_plan
from tests.support.slowest import slowest_gpu

HET = SPECS / "amp-het-cluster.yaml"


def small_mixed():
    return cluster_from_dict({"name": "mix", "nodes": [
        {"name": "a", "gpu": "A100-40GB", "count": 2, "intra_gbps": 2400, "inter_gbps": 100},
        {"name": "b", "gpu": "T4", "count": 2, "intra_gbps": 50, "inter_gbps": 25}]})


def all_partitions(num_layers: int, pp: int):
    for cuts in itertools.combinations(range(1, num_layers), pp - 1):
        yield (0, *cuts, num_layers)


@pytest.mark.parametrize("pp,dp,tp,mbs,placement", [
    (4, 1, 1, 1, (2, 0, 3, 1)),  # mixed types along one pipeline
    (2, 2, 1, 2, (0, 1, 2, 3)),  # A100 stage, T4 stage
    (2, 1, 2, 1, (2, 3, 0, 1)),  # tp pairs inside nodes, T4 first
])
def test_partition_is_optimal_against_brute_force_over_the_full_cost_model(pp, dp, tp, mbs, placement):
    cm = CostModel(small_mixed(), load_model("gpt2"))
    d = Degrees(pp, dp, tp, mbs, 8)
    got = best_for_placement(cm, d, placement)
    brute = min(
        (e for e in (cm.estimate(Strategy(pp, dp, tp, mbs, 8, p, placement)) for p in all_partitions(18, pp))
         if e.fits), key=lambda e: e.iteration_s)
    assert got is not None
    assert got.iteration_s == pytest.approx(brute.iteration_s, rel=1e-9)


def test_candidate_space_counts():
    het = load_cluster(HET)
    assert len(enumerate_degrees(het, 30, 32)) == 53  # AMP's count for 4×4, gbs 32
    assert len(enumerate_degrees(het, 30, 64)) == 65
    # tp may cross nodes only when asked
    assert max(d.tp for d in enumerate_degrees(het, 30, 32)) == 4
    assert max(d.tp for d in enumerate_degrees(het, 30, 32, allow_cross_node_tp=True)) == 16


def test_memory_pruning_is_counted_and_search_never_returns_oom():
    one_node = cluster_from_dict({"name": "t4x4", "nodes": [
        {"name": "g4", "gpu": "T4", "count": 4, "intra_gbps": 50, "inter_gbps": 50}]})
    res = search(one_node, load_model("gpt2-xl"), None, SearchOptions(gbs=16, local_search=0))
    assert res.pruned_oom > 0 and res.ranked
    # nothing past its capacity is returned; what is within it but not within its reserve says so (memory at risk)
    assert all(c.estimate.within_capacity for c in res.ranked)
    assert all(c.estimate.fits == (c.estimate.memory_risk is None) for c in res.ranked)
    assert res.candidates >= res.pruned_oom + len(res.ranked)


def test_joblib_backends_give_identical_rankings():
    het, model, prof = load_cluster(HET), load_model("gpt2-amp"), load_profile(AMP_PROFILE)
    base = SearchOptions(gbs=32, local_search=0)
    serial = search(het, model, prof, base)
    key = [(c.strategy.to_dict(), round(c.estimate.iteration_s, 12)) for c in serial.ranked]
    for backend in ("loky", "threading"):
        par = search(het, model, prof, SearchOptions(gbs=32, local_search=0, jobs=2, joblib_backend=backend))
        assert [(c.strategy.to_dict(), round(c.estimate.iteration_s, 12)) for c in par.ranked] == key
        assert (par.candidates, par.pruned_oom) == (serial.candidates, serial.pruned_oom)


def test_heterogeneity_aware_search_beats_megatron_order_on_the_amp_het_cluster():
    het, model, prof = load_cluster(HET), load_model("gpt2-amp"), load_profile(AMP_PROFILE)
    cm = CostModel(het, model, prof)
    amp_choice = cm.estimate(Strategy(4, 4, 1, 1, 32, (0, 7, 14, 20, 30)))
    best = search(het, model, prof, SearchOptions(gbs=32)).ranked[0]
    assert best.estimate.iteration_s < 0.9 * amp_choice.iteration_s
    # the T4 stage gets fewer transformer blocks than the V100 stages
    s = best.strategy
    t4_stage = next(j for j in range(s.pp) if slowest_gpu(cm, s.stage_devices(j, 0)).name == "T4")
    sizes = [b - a for a, b in zip(s.partition, s.partition[1:], strict=False)]
    assert sizes[t4_stage] < max(sizes[j] for j in range(s.pp) if j != t4_stage)


def test_search_cli_plan_validates_and_round_trips_through_evaluate(run_cli, tmp_path):
    plan = tmp_path / "plan.json"
    code, out, err = run_cli("search", "--cluster", HET, "--model", "gpt2-amp", "--profile", AMP_PROFILE,
                             "--top-k", "5", "--out", plan)
    assert code == 0, err
    for col in ("rank", "pp/dp/tp", "mbs", "GPU type per stage", "devices per stage", "partition", "s/iter",
                "samples/s", "peak GiB"):
        assert col in out
    doc = json.loads(plan.read_text())
    jsonschema.validate(doc, plan_json_schema())  # the schema generated from the model accepts what the writer wrote
    validate_plan(doc, str(plan))
    assert PlanFile.parse(doc, str(plan)).to_json() == doc  # writer and reader share one model: a lossless trip
    assert doc["schema"] == "ampe.plan/1" and len(doc["strategies"]) == 5
    assert doc["search"]["candidates"] > 0 and doc["search"]["pruned_oom"] >= 0
    times = [s["predicted"]["iteration_s"] for s in doc["strategies"]]
    assert times == sorted(times)
    ds = doc["strategies"][0]["deepspeed"]
    s0 = doc["strategies"][0]
    # no --global-batch: the default from the model and cluster, printed (gpt2-amp, 0.36B parameters: GPT-3's 0.5M
    # tokens = 512 samples of 1024 tokens, capped at 16 per device on 16 devices → 256)
    assert "global batch: 256 samples" in out
    shares = s0.get("replica_gas") or [s0["gas"]] * s0["dp"]
    assert s0["mbs"] * sum(shares) == 256 and ds["train_micro_batch_size_per_gpu"] == s0["mbs"]
    # DeepSpeed's batch check holds: under uneven shares the plan's config is the largest share's replica's
    assert ds["train_batch_size"] == s0["mbs"] * s0["gas"] * s0["dp"]
    assert ds["gradient_accumulation_steps"] == s0["gas"] and ds["fp16"]["enabled"] is True
    # every strategy of the plan is valid `ampe evaluate` input and re-costs to the same prediction
    out_json = tmp_path / "eval.json"
    code, _, err = run_cli("evaluate", "--cluster", HET, "--model", "gpt2-amp", "--profile", AMP_PROFILE,
                           "--strategy", plan, "--json", out_json)
    assert code == 0, err
    again = [r["iteration_s"] for r in json.loads(out_json.read_text())["results"]]
    assert again == pytest.approx(times, rel=1e-12)


def test_schema_rejects_a_broken_plan(tmp_path):
    from ampe.errors import InputError

    bad = {"schema": "ampe.plan/1", "cluster": "c", "model": "m", "global_batch": 32,
           "search": {"candidates": 1, "pruned_oom": 0, "seconds": 0.1},
           "strategies": [{"rank": 1, "pp": 0, "dp": 1, "tp": 1, "mbs": 1, "gas": 1, "placement": [0],
                           "partition": [0, 3], "predicted": {}, "deepspeed": {}}]}
    with pytest.raises(InputError, match=r"strategies\[0\]"):
        validate_plan(bad, "p.json")


def test_bad_search_arguments(run_cli, tmp_path):
    code, _, err = run_cli("search", "--cluster", HET, "--model", "gpt2-amp", "--top-k", "0")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--top-k" in err
    code, _, err = run_cli("search", "--cluster", HET, "--model", "gpt2-amp", "--orders", "zigzag")
    assert code == 2 and "zigzag" in err
    code, _, err = run_cli("search", "--cluster", HET, "--model", "gpt3-175b", "--global-batch", "16")
    assert code == 2 and "no strategy fits in memory" in err and len(err.strip().splitlines()) == 1


def test_dask_local_cluster_gives_the_serial_plan_and_leaves_no_worker(run_cli, tmp_path):
    """The whole `ampe search` (candidates and energy plans) on a dask LocalCluster of 2 worker processes writes the
    same strategies and clocks as the serial run, and no worker process outlives the command."""
    pytest.importorskip("distributed")
    import psutil

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    plans = {}
    for name, extra in (("serial", []), ("dask", ["--jobs", "2", "--joblib-backend", "dask"])):
        out = tmp_path / f"{name}.json"
        code, _, err = run_cli("search", "--cluster", HET, "--model", "gpt2-amp", "--profile", AMP_PROFILE,
                               "--top-k", "3", "--local-search", "0", "--out", out, *extra)
        assert code == 0, err
        doc = json.loads(out.read_text())
        plans[name] = [{k: v for k, v in s.items() if k != "predicted"} | {"t": s["predicted"]["iteration_s"]}
                       for s in doc["strategies"]]
    assert plans["dask"] == plans["serial"]
    # (the resource trackers of multiprocessing and loky are not workers: they end with this process)
    left = [p.cmdline() for p in psutil.Process().children(recursive=True) if p.pid not in before
            and p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert [c for c in left if not any("resource_tracker" in part for part in c)] == []


def test_scheduler_needs_dask(run_cli):
    code, _, err = run_cli("search", "--cluster", HET, "--model", "gpt2-amp", "--scheduler", "tcp://x:1")
    assert code == 2 and "--scheduler" in err


def test_one_job_on_the_default_backend_needs_no_joblib(monkeypatch):
    """One job on the default backend runs nothing in joblib: the block runs with joblib unimportable (the serial
    command never imports it), while a named backend still goes through joblib."""
    import sys

    from ampe.cli._backend import joblib_backend

    monkeypatch.setitem(sys.modules, "joblib", None)  # any import of joblib now raises ImportError
    with joblib_backend(None, 1):
        pass
    with pytest.raises(ImportError), joblib_backend("loky", 1):
        pass
