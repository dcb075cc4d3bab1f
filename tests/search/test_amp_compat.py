"""``--cost-model amp`` against AMP's logged predictions and partitions (amp.md §2.9) and rankings (§7 T1, T5)."""

from __future__ import annotations

import numpy as np
import pytest

from ampe.costmodel.cluster import cluster_from_dict, load_cluster
from ampe.costmodel.profile import load_profile
from ampe.costmodel.strategy import validate
from ampe.costmodel.zoo import load_model
from ampe.dp_assign import StageCosts, solve
from ampe.errors import InputError
from ampe.search.amp_compat import (
    amp_candidates,
    amp_cost,
    amp_layer_times,
    amp_predict,
    amp_search,
    amp_stage_params,
    amp_work_layers,
)
from tests.conftest import AMP_PROFILE, SPECS

CLUSTERS = {
    "homog": {"name": "amp-homogeneous",
              "nodes": [{"name": "g4", "gpu": "T4", "count": 4, "intra_gbps": 50, "inter_gbps": 50, "repeat": 4}]},
    "het-cluster": {"name": "amp-het-cluster",
                    "nodes": [{"name": "p3", "gpu": "V100-16GB", "count": 4, "intra_gbps": 170, "inter_gbps": 10,
                               "repeat": 3},
                              {"name": "g4", "gpu": "T4", "count": 4, "intra_gbps": 50, "inter_gbps": 50}]},
    "het-model": {"name": "amp-het-model",
                  "nodes": [{"name": "p3", "gpu": "V100-16GB", "count": 4, "intra_gbps": 170, "inter_gbps": 10,
                             "repeat": 4}]},
}
SETTING = {"homog": ("gpt2-amp", 32), "het-cluster": ("gpt2-amp", 32), "het-model": ("transgan", 64)}

# amp.md §2.9: setting, (mbs, tmp, dp, pp), predicted seconds, partition (AMP's logs, 4 decimals)
GOLDEN = [
    ("homog", (1, 1, 16, 1), 1.2443, [0, 30]),
    ("homog", (1, 1, 8, 2), 1.2665, [0, 15, 30]),
    ("homog", (1, 1, 4, 4), 1.2841, [0, 9, 15, 21, 30]),
    ("homog", (1, 1, 2, 8), 1.3804, [0, 6, 9, 12, 15, 18, 21, 24, 30]),
    ("homog", (1, 1, 1, 16), 1.4857, [0, 4, 6, 8, 10, 12, 14, 16, 17, 18, 19, 20, 21, 22, 23, 25, 30]),
    ("homog", (2, 1, 2, 8), 1.7268, [0, 5, 9, 12, 15, 18, 21, 24, 30]),
    ("homog", (1, 2, 8, 1), 1.9607, [0, 30]),
    ("homog", (1, 4, 4, 1), 3.3700, [0, 30]),
    ("het-cluster", (1, 1, 4, 4), 1.0859, [0, 7, 14, 20, 30]),
    ("het-cluster", (1, 1, 2, 8), 1.1402, [0, 5, 9, 12, 15, 18, 21, 24, 30]),
    ("het-cluster", (1, 1, 1, 16), 1.1465, [0, 3, 5, 7, 9, 11, 13, 15, 16, 17, 19, 20, 21, 22, 23, 25, 30]),
    ("het-cluster", (1, 1, 16, 1), 2.7789, [0, 30]),
    ("het-cluster", (1, 1, 8, 2), 1.9761, [0, 14, 30]),
    ("het-cluster", (4, 1, 4, 4), 1.8221, [0, 6, 13, 20, 30]),
    ("het-cluster", (1, 2, 2, 4), 2.0038, [0, 8, 14, 20, 30]),
    ("het-model", (1, 1, 4, 4), 1.1502, [0, 12, 44, 49, 56]),
    ("het-model", (1, 1, 2, 8), 1.3456, [0, 7, 12, 42, 44, 46, 49, 51, 56]),
    ("het-model", (1, 1, 1, 16), 1.3877, [0, 5, 8, 11, 14, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 56]),
    ("het-model", (1, 1, 16, 1), 1.7808, [0, 56]),
    ("het-model", (1, 2, 2, 4), 2.5406, [0, 13, 45, 49, 56]),
]


@pytest.fixture(scope="module")
def profile():
    return load_profile(AMP_PROFILE)


def _cluster(name):
    return cluster_from_dict(CLUSTERS[name], name)


@pytest.mark.parametrize("setting,degrees,predicted,partition", GOLDEN,
                         ids=[f"{g[0]}-mbs{g[1][0]}-tp{g[1][1]}-dp{g[1][2]}-pp{g[1][3]}" for g in GOLDEN])
def test_golden_prediction_and_partition(profile, setting, degrees, predicted, partition):
    mbs, tp, dp, pp = degrees
    model_name, gbs = SETTING[setting]
    cost, part = amp_cost(_cluster(setting), load_model(model_name), profile, pp, dp, tp, mbs, gbs)
    assert cost == pytest.approx(predicted, abs=1e-4)
    assert list(part) == partition
    # costing the published partition explicitly gives the same number
    again, _ = amp_cost(_cluster(setting), load_model(model_name), profile, pp, dp, tp, mbs, gbs, partition)
    assert again == cost


def test_candidate_counts():
    cluster = _cluster("homog")
    assert len(amp_candidates(cluster, 32)) == 53
    assert len(amp_candidates(cluster, 64)) == 65
    for pp, dp, tp, mbs in amp_candidates(cluster, 32):
        assert pp * dp * tp == 16 and tp in (1, 2, 4) and 32 % (dp * mbs) == 0


def _ranked(profile, setting):
    model_name, gbs = SETTING[setting]
    return [(p.strategy.mbs, p.strategy.tp, p.strategy.dp, p.strategy.pp, p.predicted_s)
            for p in amp_search(_cluster(setting), load_model(model_name), profile, gbs)]


def test_rankings_homogeneous(profile):
    ranked = _ranked(profile, "homog")
    assert len(ranked) == 53
    assert ranked[0][:4] == (1, 1, 16, 1) and ranked[1][:4] == (2, 1, 16, 1)  # tied at 1.2443
    assert ranked[0][4] == ranked[1][4]
    assert (1, 1, 4, 4) in [r[:4] for r in ranked[:4]]
    assert all(r[1] == 1 for r in ranked[:10])


def test_rankings_heterogeneous_cluster(profile):
    ranked = _ranked(profile, "het-cluster")
    assert {r[:4] for r in ranked[:3]} == {(1, 1, 4, 4), (1, 1, 2, 8), (1, 1, 1, 16)}
    assert [r[:4] for r in ranked].index((1, 1, 16, 1)) == 21  # "The AMP cost model ranks that strategy 21st"
    tp2 = [i for i, r in enumerate(ranked[:10]) if r[1] != 1]
    assert tp2 == [8] and ranked[8][:4] == (1, 2, 2, 4)


def test_rankings_heterogeneous_model(profile):
    ranked = _ranked(profile, "het-model")
    assert len(ranked) == 65
    assert ranked[0][:4] == (1, 1, 4, 4)
    assert all(r[1] == 1 for r in ranked[:10])


def test_search_returns_valid_strategies(profile):
    cluster = _cluster("het-cluster")
    model = load_model("gpt2-amp")
    for pred in amp_search(cluster, model, profile, 32):
        s = pred.strategy
        assert s.placement == tuple(range(16))
        assert validate(s, cluster.size, model.num_layers) == s
        assert pred.predicted_s == pytest.approx(pred.pipeline_s + pred.sync_s)


def test_exact_dp_never_loses_to_amps_quirky_dp(profile):
    """Feeding AMP's own arrays to ampe's exact DP gives a pipeline cost ≤ AMP's on every candidate, strictly less
    where the quirk bites (het-cluster dp4·pp4: AMP [0,7,14,20,30], exact [0,8,14,20,30], amp.md §3.4)."""
    from ampe.search.amp_compat import _arrays

    cluster, model = _cluster("het-cluster"), load_model("gpt2-amp")
    strictly_better = []
    for pp, dp, tp, mbs in amp_candidates(cluster, 32):
        if pp == 1 or 32 // (dp * mbs) == 1:
            continue
        arr = _arrays(cluster, model, profile, pp, dp, tp, mbs, 32)
        prefix = np.concatenate([[0.0], np.cumsum(arr.layer_s)])
        transfer = np.full((pp - 1, model.num_layers + 1), np.inf)
        transfer[:, 1:] = arr.cut_s  # stage j+1 starting at c = stage j ending at c-1
        costs = StageCosts(np.tile(prefix, (pp, 1)), transfer, arr.gas)
        exact = solve(costs, "eq5").best
        amp = amp_predict(cluster, model, profile, pp, dp, tp, mbs, 32)
        assert exact.eq5_s <= amp.pipeline_s + 1e-12
        if exact.eq5_s < amp.pipeline_s - 1e-9:
            strictly_better.append(((mbs, tp, dp, pp), exact.partition))
    assert ((1, 1, 4, 4), (0, 8, 14, 20, 30)) in strictly_better


def test_mixed_cluster_blends_profiles_by_gpu_count(profile):
    cluster = cluster_from_dict({"name": "half", "nodes": [
        {"name": "p3", "gpu": "V100-16GB", "count": 4, "intra_gbps": 170, "inter_gbps": 10, "repeat": 2},
        {"name": "g4", "gpu": "T4", "count": 4, "intra_gbps": 50, "inter_gbps": 50, "repeat": 2}]})
    model = load_model("gpt2-amp")
    got = amp_layer_times(cluster, model, profile, tp=2, mbs=4)
    for layer in (0, 5, 28):
        v = profile.layer_time("gpt2-amp", "V100-16GB", 2, layer, 1)[0]
        t = profile.layer_time("gpt2-amp", "T4", 2, layer, 1)[0]
        assert got[layer] == pytest.approx(4 * 3 * (0.5 * v + 0.5 * t), rel=1e-12)


def test_transgan_work_layers_and_params():
    model = load_model("transgan")
    work = amp_work_layers(model)
    assert len(work) == 25 and work[:2] == (0, 3) and work[-1] == 52
    assert amp_work_layers(load_model("gpt2-amp")) == tuple(range(30))
    # AMP counts 12·h² per block, no embedding term: 12·(12·1024² + 12·16²)
    assert amp_stage_params(model, [0, 56]) == [12.0 * (12 * 1024**2 + 12 * 16**2)]
    gpt = load_model("gpt2-amp")
    assert amp_stage_params(gpt, [0, 2, 28, 30]) == [1024.0 * 52256, 24 * 12.0 * 1024**2, 1024.0 * 52256]


def test_missing_profile_rows_are_an_input_error(profile):
    cluster = cluster_from_dict({"name": "a100", "nodes": [
        {"name": "n", "gpu": "A100-40GB", "count": 4, "intra_gbps": 600, "inter_gbps": 100}]})
    with pytest.raises(InputError, match="no profile row"):
        amp_cost(cluster, load_model("gpt2-amp"), profile, 1, 4, 1, 1, 32)


def test_bundled_cluster_specs_match_the_test_clusters():
    for name, spec in (("homog", "amp-homogeneous"), ("het-cluster", "amp-het-cluster"),
                       ("het-model", "amp-het-model")):
        path = SPECS / f"{spec}.yaml"
        if not path.exists():
            pytest.fail(f"missing {path}")
        loaded, built = load_cluster(path), _cluster(name)
        assert np.array_equal(loaded.bandwidth.dense(), built.bandwidth.dense())
        assert [d.gpu.name for d in loaded.devices] == [d.gpu.name for d in built.devices]
