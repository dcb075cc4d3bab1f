"""Re-planning after a cluster change (``ampe replan --without/--add/--slow``): the spec that describes the cluster
as it now is, warm starts that keep what still works, the tie-breaking rule, and one-line errors."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml

from ampe.costmodel.cluster import cluster_from_dict
from ampe.costmodel.cluster_change import ClusterChange, changed_spec, device_map, parse_slow, parse_without
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.strategy import Strategy
from ampe.costmodel.zoo import load_model
from ampe.errors import InputError
from ampe.search.cluster_replan import ReplanOption, change_between, pick, replan_cluster
from ampe.search.engine import SearchOptions

# five nodes of two A100s; the plans below use the first four (two stages × two replicas × tp 2), node a-4 is spare
SPARE = {"name": "spare", "nodes": [{"name": "a", "gpu": "A100-80GB", "count": 2, "intra_gbps": 2400,
                                     "inter_gbps": 200, "repeat": 5}]}
MODEL = load_model("gpt2-medium")


def _old(cluster, pp=2, dp=2, tp=2, placement=None):
    """The search's best micro-batch size and partition at these degrees and placement (as a search writes it)."""
    from ampe.search.engine import best_for_placement
    from ampe.search.space import Degrees

    pl = placement or tuple(range(pp * dp * tp))
    cm = CostModel(cluster, MODEL)
    ests = [best_for_placement(cm, Degrees(pp, dp, tp, mbs, 16), pl) for mbs in (1, 2, 4) if 16 // dp % mbs == 0]
    return min((e for e in ests if e is not None), key=lambda e: e.iteration_s).strategy


def test_a_dead_node_with_a_spare_keeps_every_stage_and_the_partition():
    old_cluster = cluster_from_dict(SPARE)
    old = _old(old_cluster)
    raw = changed_spec(SPARE, old_cluster, ClusterChange(without=("a-3",)))  # node a-3: stage 1's replica 1
    assert raw["down"] == ["a-3"]
    new = cluster_from_dict(raw)
    m = device_map(old_cluster, new)
    r = replan_cluster(CostModel(new, MODEL), old, old_cluster, m, SearchOptions(gbs=16))
    s = r.chosen.strategy
    assert (s.pp, s.dp, s.tp, s.mbs, s.partition) == (old.pp, old.dp, old.tp, old.mbs, old.partition)
    # ranks on surviving devices stay; the two ranks of a-3 go to the spare node a-4, as one tensor-parallel pair
    for rank, dev in enumerate(old.placement):
        if old_cluster.devices[dev].node != "a-3":
            assert s.placement[rank] == m[dev]
    gone = [rank for rank, dev in enumerate(old.placement) if old_cluster.devices[dev].node == "a-3"]
    assert [new.devices[s.placement[rank]].node for rank in gone] == ["a-4", "a-4"]
    assert r.chosen.change.ranks_moved == 2 and r.chosen.change.layers_moved == 0
    assert r.chosen.estimate.iteration_s <= min(o.estimate.iteration_s for o in r.options) * 1.005


def test_a_device_of_data_parallel_replicas_only_keeps_the_partition_of_the_others():
    # pp 1: every rank is a data-parallel replica of the whole model; a device gone takes one replica pair away
    cluster = cluster_from_dict({**SPARE, "nodes": [{**SPARE["nodes"][0], "repeat": 4}]})
    old = _old(cluster, pp=1, dp=4, tp=2)
    new = cluster_from_dict(changed_spec({**SPARE, "nodes": [{**SPARE["nodes"][0], "repeat": 4}]}, cluster,
                                         ClusterChange(without=("5",))))  # device 5: replica 2, shard 1
    m = device_map(cluster, new)
    r = replan_cluster(CostModel(new, MODEL), old, cluster, m, SearchOptions(gbs=16))
    s = r.chosen.strategy
    assert s.partition == old.partition and s.pp == 1 and s.dp < 4
    # the replicas that stay keep their devices
    kept = {m[d] for d in old.placement if d in m}
    assert set(s.placement) <= kept and r.chosen.change.ranks_moved == 0


def test_a_straggler_is_a_slowed_type_and_the_replan_is_never_slower_than_keeping_the_plan():
    old_cluster = cluster_from_dict(SPARE)
    old = _old(old_cluster)
    new = cluster_from_dict(changed_spec(SPARE, old_cluster, ClusterChange(slow=(("0", 3.0),))))
    assert new.devices[0].gpu.name == "A100-80GB slow×3" and new.devices[0].gpu.slowdown == 3
    assert new.devices[1].gpu.name == "A100-80GB"
    cm = CostModel(new, MODEL)
    kept = cm.estimate(old)
    assert kept.iteration_s > CostModel(old_cluster, MODEL).estimate(old).iteration_s
    r = replan_cluster(cm, old, old_cluster, device_map(old_cluster, new), SearchOptions(gbs=16))
    assert r.chosen.estimate.iteration_s <= kept.iteration_s
    assert 0 not in r.chosen.strategy.placement  # the spare node takes the straggler's place


def test_slowed_layer_times_are_the_healthy_types_times_the_factor():
    cluster = cluster_from_dict({**SPARE, "stragglers": {"a-0:1": 2.5}})
    cm = CostModel(cluster, MODEL)
    slow, healthy = cluster.devices[1].gpu, cluster.devices[0].gpu
    a, b = cm.layer_times(slow, 1, 2), cm.layer_times(healthy, 1, 2)
    assert a.forward_s == pytest.approx(2.5 * b.forward_s) and a.backward_s == pytest.approx(2.5 * b.backward_s)
    assert slow.healthy() == healthy and slow.memory_bytes == healthy.memory_bytes
    from ampe.energy.dvfs import params_for

    assert params_for(slow) == params_for(healthy)  # it draws as its healthy type


def test_change_distance_counts_moved_ranks_and_layers():
    old = Strategy(pp=2, dp=2, tp=1, mbs=1, gbs=8, partition=(0, 3, 6), placement=(0, 1, 2, 3))
    same = {0: 0, 1: 1, 2: 2, 3: 3, 5: 5}
    c = change_between(old, replace(old, placement=(0, 1, 2, 5)), same)
    assert (c.ranks_moved, c.layers_moved, c.moved) == (1, 0, (3,))
    c = change_between(old, replace(old, partition=(0, 4, 6)), same)
    assert (c.ranks_moved, c.layers_moved) == (0, 1)
    # two stages swapped: every rank moves (its device ran the other stage), no layer changes hands
    c = change_between(old, replace(old, placement=(2, 3, 0, 1)), same)
    assert (c.ranks_moved, c.layers_moved) == (4, 0)
    # one stage dropped: the new stage continues old stage 1, which held most of its layers; stage 0's move
    uneven = replace(old, partition=(0, 2, 6))
    c = change_between(uneven, Strategy(pp=1, dp=2, tp=1, mbs=1, gbs=8, partition=(0, 6), placement=(2, 3)), same)
    assert c.stage_was == (1,) and (c.ranks_moved, c.layers_moved, c.ranks_dropped) == (0, 2, 2)
    # on stage 0's devices instead: continuing stage 0 (2 ranks + 2 layers kept) ties with stage 1 (4 layers)
    c = change_between(uneven, Strategy(pp=1, dp=2, tp=1, mbs=1, gbs=8, partition=(0, 6), placement=(0, 1)), same)
    assert c.stage_was == (0,) and (c.ranks_moved, c.layers_moved) == (0, 4)


def _option(cm, old, seconds, moved):
    est = replace(cm.estimate(old), iteration_s=seconds)
    from ampe.search.cluster_replan import Change

    return ReplanOption(est, f"{seconds}", Change(moved, 0, 0))


def test_ties_within_half_a_percent_go_to_the_smallest_change():
    cluster = cluster_from_dict(SPARE)
    cm = CostModel(cluster, MODEL)
    old = _old(cluster)
    fast, near, far = _option(cm, old, 1.0, 10), _option(cm, old, 1.004, 2), _option(cm, old, 1.006, 0)
    assert pick([fast, near, far]) is near  # 0.4 % slower, 8 fewer moves; 0.6 % is outside the tolerance
    assert pick([fast, near, far], tolerance=0.0) is fast
    assert pick([fast, near, far], tolerance=0.01) is far
    assert pick([near, _option(cm, old, 1.003, 2)]).estimate.iteration_s == 1.003  # same change: the faster


@pytest.mark.parametrize(("flags", "where"), [
    (["--without", "zz-9"], "--without"),
    (["--without", ""], "--without"),
    (["--without", "99"], "--without"),
    (["--without", "p3-0:7"], "--without"),
    (["--without", "p3-0,p3-1,p3-2,g4-0"], "--without"),
    (["--slow", "3"], "--slow"),
    (["--slow", "3=0.5"], "--slow"),
    (["--slow", "3=fast"], "--slow"),
    (["--slow", "3=inf"], "--slow"),
    (["--slow", "zz=2"], "--slow"),
    (["--without", "p3-0", "--frozen-layers", "2"], "--frozen-layers"),
    ([], "--frozen-layers"),
])
def test_bad_changes_are_one_line_errors(tmp_path, run_cli, plan_file, flags, where):
    code, _out, err = run_cli("replan", "--plan", plan_file, *flags)
    assert code == 2 and where in err and len(err.strip().splitlines()) == 1, err


def test_bad_fragments_name_the_file_and_field(tmp_path, run_cli, plan_file):
    frag = tmp_path / "add.yaml"
    for text, field in [("gpus: []\n", "nodes"),
                        ("nodes: [{name: q, gpu: V100-16GB, count: 0, intra_gbps: 1, inter_gbps: 1}]\n", "count"),
                        ("nodes: [{name: p3-0, gpu: V100-16GB, count: 4, intra_gbps: 170, inter_gbps: 10}]\n",
                         "not down"),
                        ("nodes: [{name: q, gpu: V100-16GB, count: 4, intra_gbps: 1, inter_gbps: 1}]\nlatency_us: 3\n",
                         "latency_us")]:
        frag.write_text(text)
        code, _, err = run_cli("replan", "--plan", plan_file, "--add", frag)
        assert code == 2 and str(frag) in err and field in err and len(err.strip().splitlines()) == 1, err


def test_parsers():
    assert parse_without("p3-1, 17,g4-0:2") == ("p3-1", "17", "g4-0:2")
    assert parse_slow("17=2,p3-1:2=1.5") == (("17", 2.0), ("p3-1:2", 1.5))
    with pytest.raises(InputError):
        parse_without("a,,b")


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    """One searched plan for the module (read only: every test writes its own outputs elsewhere)."""
    from conftest import AMP_PROFILE, SPECS

    from ampe.cli import main

    plan = tmp_path_factory.mktemp("searched") / "plan.json"
    code = main([str(a) for a in ("search", "--cluster", SPECS / "amp-het-cluster.yaml", "--model", "gpt2-amp",
                                  "--profile", AMP_PROFILE, "--global-batch", "32", "--top-k", "2",
                                  "--energy-planner", "none", "--out", plan)])
    assert code == 0
    return plan


def test_a_node_gone_and_back_round_trips_through_the_written_spec_and_plan(tmp_path, run_cli, plan_file):
    from ampe.trials.planfile import load_plan

    gone = tmp_path / "gone.json"
    code, out, err = run_cli("replan", "--plan", plan_file, "--without", "p3-1", "--out", gone)
    assert code == 0, err
    assert "p3-1 -4 (down)" in out and "time: " in out and "energy: " in out
    spec = yaml.safe_load((tmp_path / "gone.cluster.yaml").read_text())
    assert spec["down"] == ["p3-1"]
    doc = json.loads(gone.read_text())
    assert doc["inputs"]["cluster_spec"] == str(tmp_path / "gone.cluster.yaml")  # absolute as given
    assert len(doc["devices"]) == 12 and all(d["node"] != "p3-1" for d in doc["devices"])
    assert doc["strategies"][0]["predicted"]["energy_j"] > 0
    tp = load_plan(gone)  # what `ampe trial` reads
    assert tp.cluster_spec is not None and tp.strategies[0].strategy.placement
    back = tmp_path / "back.yaml"
    back.write_text("nodes: [{name: p3-1, gpu: V100-16GB, count: 4, intra_gbps: 170, inter_gbps: 10}]\n")
    code, out, err = run_cli("replan", "--plan", gone, "--add", back, "--energy-planner", "none", "--top-k", "3",
                             "--out", tmp_path / "back.json")
    assert code == 0, err
    again = yaml.safe_load((tmp_path / "back.cluster.yaml").read_text())
    written = json.loads((tmp_path / "back.json").read_text())
    assert "down" not in again and len(written["devices"]) == 16
    ranks = written["strategies"]
    assert [e["rank"] for e in ranks] == [1, 2, 3]  # the chosen one, then the fastest others
    times = [e["predicted"]["iteration_s"] for e in ranks[1:]]
    assert times == sorted(times)
    # a plan whose spec changed since it was made is refused: by its hash, and (an older plan without hashes) by
    # its devices
    (tmp_path / "gone.cluster.yaml").write_text(yaml.safe_dump({**spec, "down": ["p3-2"]}))
    code, _, err = run_cli("replan", "--plan", gone, "--without", "p3-0")
    assert code == 2 and "inputs.cluster_spec" in err and "changed since the plan was made" in err, err
    gone.write_text(json.dumps({**doc, "inputs": {k: v for k, v in doc["inputs"].items() if k != "sha256"}}))
    code, _, err = run_cli("replan", "--plan", gone, "--without", "p3-0")
    assert code == 2 and "devices[" in err and "spec changed" in err, err


def test_an_interleaved_plan_is_replanned_with_its_chunks_on_their_device_stages():
    from ampe.search.cluster_replan import layer_stages
    from ampe.search.engine import search

    raw = {**SPARE, "nodes": [{**SPARE["nodes"][0], "repeat": 4}]}
    cluster = cluster_from_dict(raw)
    opts = SearchOptions(gbs=16, schedules=("interleaved",), top_k=1)
    old = search(cluster, MODEL, None, opts).ranked[0].strategy
    assert old.virtual_stages == 2
    assert layer_stages(old)[old.partition[old.pp]] == 0  # the second chunk of stage 0 is on stage 0 again
    new = cluster_from_dict(changed_spec(raw, cluster, ClusterChange(without=("a-3",))))
    r = replan_cluster(CostModel(new, MODEL), old, cluster, device_map(cluster, new), opts)
    s = r.chosen.strategy
    assert s.schedule == "interleaved" and s.virtual_stages == 2 and s.gas % s.pp == 0
    assert len(r.chosen.change.stage_was) == s.pp and r.chosen.estimate.fits


def test_a_straggler_can_be_answered_by_moving_samples_away_from_its_replica():
    spec = {**SPARE, "nodes": [{**SPARE["nodes"][0], "repeat": 4}]}  # no spare node
    old_cluster = cluster_from_dict(spec)
    old = _old(old_cluster)
    new = cluster_from_dict(changed_spec(spec, old_cluster, ClusterChange(slow=(("a-3", 2.0),))))
    cm = CostModel(new, MODEL)
    r = replan_cluster(cm, old, old_cluster, device_map(old_cluster, new), SearchOptions(gbs=16))
    moved = [o for o in r.options if o.how.endswith(f"old partition, shares {':'.join(map(str, o.strategy.shares))}")]
    assert moved, [o.how for o in r.options]
    o = min(moved, key=lambda o: o.estimate.iteration_s)
    # a-3 holds replica 1's second stage: the slowed replica gets fewer micro-batches, nothing else changes
    assert o.strategy.shares[1] < o.strategy.shares[0] and sum(o.strategy.shares) * o.strategy.mbs == 16
    assert o.change.distance == 0 and o.estimate.iteration_s < cm.estimate(old).iteration_s
    assert pick(list(r.options), tolerance=0.05).how == o.how  # within 5 %: the smallest change, the shares
