"""Issue 25: every record carries the strategy as it ran — memory options (ZeRO stage, per-stage recomputation),
attention kernel and precision — and the report re-predicts exactly that.

The round trip: a plan entry with ZeRO-1 and per-stage recomputation → ``ampe export`` → the recorder in the user's
script (``ampe.runtime.user``) → ``ampe report --measurements``, whose prediction must equal ``ampe evaluate``'s for
the same strategy. Older lines without the fields still read, and the report names what it assumed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.strategy import strategy_from_dict
from ampe.costmodel.zoo import load_model
from ampe.formats.measurement import read_measurements
from ampe.formats.trial import TrialResult, strategy_label
from ampe.report.compare import report_from_results
from ampe.report.measurements import report_from_measurements
from ampe.trials.planfile import load_plan
from tests.support.trial_fixtures import strategy, write_plan

ROOT = Path(__file__).resolve().parents[2]
GPT3 = "gpt3-1.3b"
A100S = """name: a100x8
nodes:
  - {name: n, gpu: A100-80GB, count: 8, intra_gbps: 2400, inter_gbps: 200}
"""
# ZeRO-1 over dp 2, selective recomputation on the first pipeline stage only, flash attention, bf16
AS_RAN = {"pp": 4, "dp": 2, "tp": 1, "mbs": 2, "gbs": 64, "zero": 1, "recompute": "selective",
          "stage_recompute": ["selective", "none", "none", "none"]}


def _plan(tmp: Path) -> Path:
    """A plan of GPT-3 1.3B on 8 A100s whose rank-1 entry runs AS_RAN (its prediction from the cost model)."""
    (tmp / "a100.yaml").write_text(A100S)
    cluster, model = load_cluster(tmp / "a100.yaml"), load_model(GPT3)
    est = CostModel(cluster, model).estimate(strategy_from_dict(AS_RAN))
    entry = {**est.strategy.to_dict(), "rank": 1, "attention": "eager", "dtype": "fp16",
             "predicted": {"iteration_s": est.iteration_s, "max_memory_bytes": est.max_memory_bytes,
                           "memory_bytes_per_stage": list(est.memory_bytes_per_stage), "fits": est.fits},
             "deepspeed": {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2,
                           "gradient_accumulation_steps": 16}}
    doc = {"schema": "ampe.plan/1", "cluster": "a100x8", "model": GPT3, "global_batch": 64,
           "inputs": {"cluster_spec": str(tmp / "a100.yaml"), "model": GPT3},
           "search": {"candidates": 1, "pruned_oom": 0, "seconds": 0.0}, "strategies": [entry]}
    path = tmp / "plan.json"
    path.write_text(json.dumps(doc))
    return path


def test_plan_export_recorder_report_round_trip_predicts_what_evaluate_predicts(tmp_path, run_cli, monkeypatch):
    pytest.importorskip("torch")
    from ampe.runtime import load_export

    plan = _plan(tmp_path)
    code, _, err = run_cli("export", "--plan", plan, "--out", tmp_path / "exp", "--script", "train.py")
    assert code == 0, err
    export = json.loads((tmp_path / "exp" / "export.json").read_text())
    for key, value in AS_RAN.items():  # the export's strategy is the entry's, memory options included
        assert export["strategy"][key] == value, key
    assert (export["strategy"]["attention"], export["strategy"]["dtype"]) == ("eager", "fp16")
    assert export["deepspeed"]["zero_optimization"]["stage"] == 1

    # the user's script records a run of rank 0 (no process group: the recorder writes its own line)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    exported = load_export(tmp_path / "exp" / "export.json", rank=0)
    assert exported.recompute == "selective" and exported.attention == "eager"
    exported.file = exported.file.model_copy(update={"device": "cpu"})  # time it here, on the CPU
    lines = tmp_path / "m.jsonl"
    with exported.recorder(path=lines, warmup=1) as rec:
        for _ in range(3):
            rec.step(lambda: None)
    [line] = [json.loads(x) for x in lines.read_text().splitlines()]
    for key, value in AS_RAN.items():
        assert line["strategy"][key] == value, key
    assert (line["strategy"]["attention"], line["strategy"]["dtype"]) == ("eager", "fp16")

    # the report re-predicts what ran: the memory `ampe evaluate` predicts for the same strategy
    (tmp_path / "s.json").write_text(json.dumps(AS_RAN))
    code, _, err = run_cli("evaluate", "--cluster", tmp_path / "a100.yaml", "--model", GPT3, "--strategy",
                           tmp_path / "s.json", "--json", tmp_path / "ev.json")
    assert code == 0, err
    evaluated = json.loads((tmp_path / "ev.json").read_text())["results"][0]
    got = report_from_measurements(read_measurements(lines), load_cluster(tmp_path / "a100.yaml"),
                                   load_model(GPT3))
    [row] = got.report.rows
    assert row.predicted_memory_bytes == evaluated["max_memory_bytes"]
    assert row.predicted_s == pytest.approx(evaluated["iteration_s"], rel=1e-12)
    assert got.assumed == ()  # the line said everything
    assert "zero1" in row.label and "selective" in row.label
    # without its memory options the same layout predicts another memory (what the report did before issue 25)
    plain = CostModel(load_cluster(tmp_path / "a100.yaml"), load_model(GPT3)).estimate(
        strategy_from_dict({k: v for k, v in AS_RAN.items() if k not in ("zero", "recompute", "stage_recompute")}))
    assert plain.max_memory_bytes != row.predicted_memory_bytes


def test_older_lines_still_read_and_the_report_names_what_it_assumed(tmp_path):
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps({"strategy": {"pp": 2, "dp": 1, "tp": 1, "mbs": 1, "gbs": 8,
                                             "partition": [0, 5, 10]}, "iteration_s": 0.5, "status": "ok"}) + "\n"
                    + json.dumps({"strategy": {"pp": 2, "dp": 1, "tp": 1, "mbs": 1, "gbs": 8,
                                               "partition": [0, 5, 10], "zero": 0, "recompute": "full",
                                               "attention": "eager", "dtype": "fp32"},
                                  "iteration_s": 0.6, "status": "ok"}) + "\n")
    spec = tmp_path / "c.yaml"
    spec.write_text("name: cpu2\nnodes:\n  - {name: h, gpu: cpu, count: 2, intra_gbps: 40, inter_gbps: 40}\n")
    got = report_from_measurements(read_measurements(path), load_cluster(spec), load_model("gpt2-tiny"))
    assert len(got.runs) == 2  # the same layout with another recomputation is another strategy, not a repeat
    # line 1 names none of the four fields (line 2 ran fp32 without naming TF32: nothing to assume on a CPU)
    assert [a.split(" line")[0] for a in got.assumed] == ["1"] * 4
    assert any("recompute" in a and "assumed none" in a for a in got.assumed)
    assert any("attention" in a and "eager (the model's)" in a for a in got.assumed)
    assert any(a.startswith("1 line(s) do not name dtype (line 1)") for a in got.assumed)


def test_a_trial_that_ran_another_precision_is_predicted_again_as_it_ran(tmp_path):
    """A CPU trial runs fp32 where the plan costed the model's own precision: the report predicts it again (and says
    so); the kernel the worker recorded is checked against the planned attention."""
    plan_path = write_plan(tmp_path, [strategy(1, 2, 1, 1, 0.02)])
    plan = load_plan(plan_path)
    s = plan.strategies[0].strategy.to_dict()
    base = dict(key="k", trial_id="t", plan_rank=1, model="gpt2-tiny", cluster="cpu2", freq_backend="none",
                schedule_applied=False, warmup_iters=1, timed_iters=3, status="ok", iteration_s=(0.1, 0.1, 0.1),
                iteration_s_mean=0.1, predicted_iteration_s=0.02)
    as_planned = TrialResult(strategy={**s, "attention": "eager", "dtype": "fp32"},
                             worker={"attention_kernels": ["eager"]}, **base)
    report = report_from_results([as_planned], plan)
    assert report.rows[0].predicted_s == 0.02 and report.notes == ()  # as the plan costed it: kept, no note
    bf16 = TrialResult(strategy={**s, "attention": "flash", "dtype": "bf16"},
                       worker={"attention_kernels": ["sdpa-math"]}, **base)
    report = report_from_results([bf16], plan)
    row = report.rows[0]
    expected = CostModel(load_cluster(tmp_path / "cluster.yaml"), load_model("gpt2-tiny", "flash", "bf16")).estimate(
        strategy_from_dict(s))
    assert row.predicted_s == pytest.approx(expected.iteration_s) and row.predicted_s != 0.02
    assert row.predicted_memory_bytes == expected.max_memory_bytes
    assert any("ran flash/bf16, the plan costed eager/fp32" in n for n in row.notes)
    assert any("sdpa-math ran" in n for n in row.notes)  # planned flash, but the math kernel kept the scores
    assert strategy_label(bf16.strategy).endswith("·flash")
