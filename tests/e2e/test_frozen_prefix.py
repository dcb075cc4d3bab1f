"""FreezePipe end to end: ``ampe replan --frozen-layers N --out`` writes a plan whose trials run the first N layers
forward only on stock DeepSpeed (ampe.runtime.freeze), and the cost model's view of a frozen prefix (a tied weight
that keeps training through the LM head) matches what the worker runs."""

from __future__ import annotations

import json

import pytest

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.strategy import Strategy
from ampe.costmodel.zoo import load_model
from ampe.runtime.freeze import FrozenCuts
from ampe.trials.planfile import load_plan

MODEL = "gpt2-tiny"  # 0 embedding | 1 noop | 2..5 blocks | 6 noop | 7 norm | 8 logits (tied) | 9 noop


def test_frozen_cuts_follow_the_partition():
    parts = [0, 4, 7, 10]
    assert FrozenCuts.of(parts, 0, 4) == FrozenCuts(input_frozen=False, output_frozen=True)
    assert FrozenCuts.of(parts, 1, 4) == FrozenCuts(input_frozen=True, output_frozen=False)
    assert FrozenCuts.of(parts, 2, 4) == FrozenCuts(input_frozen=False, output_frozen=False)
    assert FrozenCuts.of(parts, 1, 7) == FrozenCuts(input_frozen=True, output_frozen=True)  # an all-frozen stage
    assert FrozenCuts.of(parts, 2, 9) == FrozenCuts(input_frozen=True, output_frozen=False)  # last stage trains
    assert FrozenCuts.of(parts, 0, 0) == FrozenCuts(False, False)


def test_frozen_embedding_keeps_its_tied_weight_trainable_in_the_cost_model():
    model = load_model(MODEL)
    frozen = model.with_frozen_prefix(4)
    emb, head = frozen.layers[0], frozen.layers[8]
    assert emb.frozen and emb.tied_trainable and not head.frozen
    assert emb.trainable_params_per_rank() == emb.tied_params  # the word embedding trains; positions do not
    assert frozen.layers[2].trainable_params_per_rank() == 0  # a frozen block trains nothing
    cm_all, cm_frozen = CostModel(load_cluster_spec(), model), CostModel(load_cluster_spec(), frozen)
    s = Strategy(pp=2, dp=1, tp=1, mbs=2, gbs=8, partition=(0, 4, 10))
    before, after = cm_all.estimate(s), cm_frozen.estimate(s)
    # Stage 0 still all-reduces the tied gradient with the LM head's stage and steps it; its blocks run forward
    # only, keep no activations and send no gradient back.
    assert after.tied_sync_s == pytest.approx(before.tied_sync_s) and after.tied_sync_s > 0
    assert after.bwd_s[0][0] == 0.0 and before.bwd_s[0][0] > 0
    assert after.memory_bytes_per_stage[0] < before.memory_bytes_per_stage[0]
    # Every layer frozen but the LM head: the whole tied weight still trains.
    assert model.with_frozen_prefix(8).layers[0].tied_trainable
    assert not model.with_frozen_prefix(10).layers[0].tied_trainable


def load_cluster_spec():
    from conftest import SPECS

    return load_cluster(SPECS / "local-cpu.yaml")


@pytest.mark.trial
def test_replanned_frozen_prefix_trial_runs_forward_only(tmp_path, run_cli):
    pytest.importorskip("deepspeed")
    from conftest import SPECS

    plan = tmp_path / "plan.json"
    code, _, err = run_cli("search", "--cluster", SPECS / "local-cpu.yaml", "--model", MODEL, "--global-batch", "8",
                           "--top-k", "30", "--out", plan)
    assert code == 0, err
    rank = next(e["rank"] for e in json.loads(plan.read_text())["strategies"] if e["pp"] == 2 and e["mbs"] == 2)
    frozen_plan = tmp_path / "frozen.json"
    code, _out, err = run_cli("replan", "--plan", plan, "--rank", str(rank), "--frozen-layers", "4",
                             "--out", frozen_plan)
    assert code == 0, err
    fp = load_plan(frozen_plan)
    assert fp.frozen_layers == 4 and 1 <= len(fp.strategies) <= 2
    keep = fp.strategies[-1].strategy  # the old partition; rank 1 is the re-partitioned one
    # Run the old partition: its stage 0 is all frozen (layers 0-3) unless the search put block 1 behind the cut.
    results = tmp_path / "trials"
    code, _out, err = run_cli("trial", "--plan", frozen_plan, "--top-k", "2", "--warmup", "2", "--iters", "2",
                             "--timeout", "300", "--out", results, "--progress", "none", "--freq-backend", "none")
    assert code == 0, err
    lines = [json.loads(l) for l in (results / "results.jsonl").read_text().splitlines()]
    assert len(lines) == len(fp.strategies) and all(l["status"] == "ok" for l in lines), lines
    for line in lines:
        ranks = json.loads((results / "trials" / line["trial_id"] / "result.json").read_text())["ranks"]
        first, last = sorted(ranks, key=lambda r: r["stage"])
        assert first["tied_weight_sha1"] == last["tied_weight_sha1"] != {}  # the tied copies stayed identical
        assert first["detached_tied_params"] > 0  # the frozen input embedding looks its weight up detached
        assert first["frozen_params"] > 0 and last["frozen_params"] == 0
        assert line["worker"]["loss_last"] < line["worker"]["loss_first"]  # gas 4: every step sees the 4 batches
        cut = line["strategy"]["partition"][1]
        if cut <= 4:  # stage 0 holds only frozen layers: its backward and the gradient across the cut are skipped
            assert first["frozen_instructions"] == ["BackwardPass", "RecvGrad"]
            assert last["frozen_instructions"] == ["SendGrad"]
        else:
            assert first["frozen_instructions"] == [] and last["frozen_instructions"] == []
    assert any(l["strategy"]["partition"] == list(keep.partition) for l in lines)
