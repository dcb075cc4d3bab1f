"""Fuzz every input of every command: a mutated cluster spec, model YAML, profile CSV, strategy, plan or results
line gives exit 0 or exit 2 with one line naming a file or flag — never a traceback (an exception escaping
``ampe.cli.main`` fails the test) — in bounded time. Reproducers of past findings are kept in REGRESSIONS."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampe.cli import main
from tests.support import fuzz
from tests.support.trial_fixtures import four_strategies, write_plan

CLUSTER = {"name": "fz", "nodes": [{"name": "h", "gpu": "cpu", "count": 2, "intra_gbps": 40, "inter_gbps": 40}],
           "gpu_types": {"cpu2": {"base": "cpu", "memory_gb": 8}}}
MODEL = {"name": "m4", "dtype": "fp32", "seq_len": 16, "hidden": 32,
         "layers": [{"kind": "embedding", "params": 4096, "fwd_flops": 0, "out_elems": 512, "tied": "e"},
                    {"kind": "transformer", "params": 12416, "fwd_flops": 4.0e5, "out_elems": 512, "repeat": 2},
                    {"kind": "logits", "params": 4096, "fwd_flops": 1.3e5, "out_elems": 2048, "tied": "e"}]}
STRATEGY = {"pp": 2, "dp": 1, "tp": 1, "mbs": 1, "gbs": 4, "partition": [0, 2, 4]}
PROFILE = "model,device,tp,mbs,layer,forward_s,backward_s\n" + "".join(
    f"m4,cpu,1,1,{i},0.001,0.002\n" for i in range(4))

junk = st.one_of(
    st.none(), st.booleans(), st.integers(-10**6, 10**6), st.sampled_from([10**30, -1, 0, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8), st.just("x" * 5000),
    st.lists(st.integers(-3, 40), max_size=5), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def mutated(base: Any) -> Any:
    """``base`` with a few values replaced by junk, deleted or added."""
    return fuzz.mutated(base, junk)


def _run(capsys: Any, *argv: Any) -> tuple[int, str]:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:  # argparse
        code = e.code if isinstance(e.code, int) else 1
    err = capsys.readouterr().err
    assert code in (0, 2), err
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err
    return code, err


def _inputs(tmp: Path, cluster: Any = CLUSTER, model: Any = MODEL, profile: str = PROFILE,
            strategy: Any = STRATEGY) -> list[Any]:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "c.yaml").write_text(yaml.safe_dump(cluster) if not isinstance(cluster, str) else cluster)
    (tmp / "m.yaml").write_text(yaml.safe_dump(model) if not isinstance(model, str) else model)
    (tmp / "p.csv").write_text(profile)
    (tmp / "s.json").write_text(json.dumps(strategy))
    return ["evaluate", "--cluster", tmp / "c.yaml", "--model", tmp / "m.yaml", "--profile", tmp / "p.csv",
            "--strategy", tmp / "s.json"]


FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def test_the_base_inputs_are_good(tmp_path, capsys):
    assert _run(capsys, *_inputs(tmp_path))[0] == 0


@FUZZ
@given(cluster=mutated(CLUSTER))
def test_fuzzed_cluster_specs(tmp_path_factory, capsys, cluster):
    _run(capsys, *_inputs(tmp_path_factory.mktemp("c"), cluster=cluster))


@FUZZ
@given(model=mutated(MODEL))
def test_fuzzed_models(tmp_path_factory, capsys, model):
    _run(capsys, *_inputs(tmp_path_factory.mktemp("m"), model=model))


@FUZZ
@given(strategy=mutated(STRATEGY))
def test_fuzzed_strategies(tmp_path_factory, capsys, strategy):
    _run(capsys, *_inputs(tmp_path_factory.mktemp("s"), strategy=strategy))


@FUZZ
@given(cells=st.lists(st.sampled_from(["", "-1", "nan", "inf", "1e309", "x", "true", "0", "3", "m4", "cpu",
                                        '"a,b"', "9" * 400]), min_size=1, max_size=9),
       row=st.integers(1, 4))
def test_fuzzed_profiles(tmp_path_factory, capsys, cells, row):
    lines = PROFILE.splitlines()
    lines[row] = ",".join(cells)
    _run(capsys, *_inputs(tmp_path_factory.mktemp("p"), profile="\n".join(lines) + "\n"))


@FUZZ
@given(data=st.data())
def test_fuzzed_plans_for_every_plan_reader(tmp_path_factory, capsys, data):
    tmp = tmp_path_factory.mktemp("plan")
    good = json.loads(write_plan(tmp, four_strategies()).read_text())
    plan = data.draw(mutated(good))
    path = tmp / "bad.json"
    path.write_text(json.dumps(plan))
    _run(capsys, "evaluate", "--cluster", tmp / "cluster.yaml", "--model", "gpt2-tiny", "--strategy", path)
    _run(capsys, "replan", "--plan", path, "--frozen-layers", "2")
    _run(capsys, "trial", "--plan", path, "--dry-run", "--out", tmp / "runs")
    _run(capsys, "export", "--plan", path, "--out", tmp / "export")


@FUZZ
@given(data=st.data())
def test_fuzzed_results_lines(tmp_path_factory, capsys, data):
    from ampe.formats.trial import TrialResult

    tmp = tmp_path_factory.mktemp("r")
    plan = write_plan(tmp, four_strategies())
    good = TrialResult(key="k", trial_id="t", plan_rank=1, strategy=four_strategies()[0], model="gpt2-tiny",
                       cluster="cpu2", freq_backend="none", schedule_applied=False, warmup_iters=1, timed_iters=3,
                       status="ok", iteration_s=(0.02, 0.021), iteration_s_mean=0.0205,
                       predicted_iteration_s=0.02).to_dict()
    out = tmp / "out"
    out.mkdir()
    (out / "plan.json").write_text(plan.read_text())
    (out / "results.jsonl").write_text(json.dumps(data.draw(mutated(good))) + "\n")
    _run(capsys, "report", out)


REGRESSIONS = [  # (what, a cluster/model/strategy edit) — inputs that once printed a traceback or ran away
    ("latency inf", {"cluster": {**CLUSTER, "latency_us": float("inf")}}),
    ("count true", {"cluster": {**CLUSTER, "nodes": [{**CLUSTER["nodes"][0], "count": True}]}}),
    ("memory inf", {"cluster": {**CLUSTER, "gpu_types": {"cpu2": {"base": "cpu", "memory_gb": float("inf")}}}}),
    ("huge flops", {"model": {**MODEL, "layers": [{**MODEL["layers"][0], "fwd_flops": 1e308}, *MODEL["layers"][1:]]}}),
    ("5000-digit gbs", {"strategy": {**STRATEGY, "gbs": int("9" * 4000)}}),
    ("nested", {"strategy": "[" * 100000 + "]" * 100000}),
    ("idle above tdp", {"cluster": {**CLUSTER, "gpu_types": {"cpu2": {"base": "cpu", "idle_w": 99}}}}),
    ("device explosion", {"cluster": {**CLUSTER, "nodes": [{**CLUSTER["nodes"][0], "repeat": 100000,
                                                            "count": 4096}]}}),
]


@pytest.mark.parametrize("what, edit", REGRESSIONS, ids=[w for w, _ in REGRESSIONS])
def test_regressions_are_one_line_errors(tmp_path, capsys, what, edit):
    argv = _inputs(tmp_path, **{k: v for k, v in edit.items() if k != "strategy"})
    if "strategy" in edit:
        s = edit["strategy"]
        (tmp_path / "s.json").write_text(s if isinstance(s, str) else json.dumps(s))
    code, _err = _run(capsys, *argv)
    assert code == 2, what


# Issue 25's fuzz residue: 1,165 generated bad inputs over every command left tracebacks, hangs, a 4 GB run and
# silent acceptances at the edges below. Each case is a command line built in a folder of good inputs (``_edges``):
# it must give the exit status listed — 2 with one line naming the flag or file, saying the words listed — and
# nothing may be left half-written. (what, argv builder, expected exit status, words in the error line)
def _edges(tmp: Path) -> dict[str, Any]:
    from tests.support.synthetic_profiles import profile_rows

    argv = _inputs(tmp)
    plan = write_plan(tmp / "plan", [_scheduled(1), *four_strategies()[1:]])
    doc = json.loads(plan.read_text())
    doc["strategies"][0]["frequency_plan"]["stages"][1][0][1] = 99  # micro-batch 99 of 8
    (tmp / "mb99.json").write_text(json.dumps(doc))
    doc = json.loads(plan.read_text())
    doc["inputs"]["cluster_spec"] = "a\x00b.yaml"
    (tmp / "nul.json").write_text(json.dumps(doc))
    (tmp / "loop1").symlink_to(tmp / "loop2")
    (tmp / "loop2").symlink_to(tmp / "loop1")
    (tmp / "perseus.csv").write_text("\n".join(profile_rows("lm_head", 2, 1)) + "\n")
    one = {"pp": 2, "dp": 1, "tp": 1, "mbs": 1, "gbs": 4}
    (tmp / "10k.json").write_text(json.dumps([one] * 10_000))
    (tmp / "63mb.json").write_text("[" + ",".join(["0"] * 31_000_000) + "]")  # 62 MB: read in ~2 s, then refused
    search = ["search", "--cluster", tmp / "c.yaml", "--model", tmp / "m.yaml", "--profile", tmp / "p.csv",
              "--global-batch", "4", "--top-k", "2"]
    frontier = ["frontier", "--profile", tmp / "perseus.csv", "--stages", "2", "--microbatches", "4"]
    return {"evaluate": argv, "search": search, "plan": plan, "frontier": frontier}


def _scheduled(rank: int) -> dict[str, Any]:
    """A pp 2 plan entry (8 micro-batches) with a valid frequency plan."""
    from tests.support.trial_fixtures import strategy

    steps = [["forward", m, 2000] for m in range(8)] + [["backward", m, 3000] for m in range(8)]
    return strategy(rank, 2, 1, 1, 0.02, frequency_plan={"stages": [steps, steps], "time_s": 0.02, "energy_j": 1.0})


EDGE_CASES: list[tuple[str, Any, int, str]] = [
    # paths
    ("NUL byte in --out", lambda t, e: [*e["search"], "--out", t / "a\x00b.json"], 2, "NUL byte"),
    ("NUL byte in a plan's input path", lambda t, e: ["trial", "--plan", t / "nul.json", "--dry-run", "--out",
                                                       t / "runs"], 2, "NUL byte"),
    ("name over 255 bytes", lambda t, e: [*e["evaluate"], "--json", t / ("x" * 300 + ".json")], 2,
     "305 bytes long (at most 255)"),
    ("symlink loop as --out", lambda t, e: [*e["search"], "--out", t / "loop1"], 2, "loop of symbolic links"),
    ("symlink loop as input", lambda t, e: ["evaluate", "--cluster", t / "loop1", "--model", "gpt2-tiny",
                                            "--strategy", t / "s.json"], 2, "symbolic links"),
    ("newline in search --out", lambda t, e: [*e["search"], "--out", t / "a\nb.json"], 2, "control character"),
    ("newline in evaluate --json", lambda t, e: [*e["evaluate"], "--json", t / "a\nb.json"], 2, "control character"),
    ("newline in frontier --out", lambda t, e: [*e["frontier"], "--out", t / "a\nb.json"], 2, "control character"),
    ("newline in report --json", lambda t, e: ["report", t / "runs", "--json", t / "a\nb.json"], 2,
     "control character"),
    ("newline in replan --out", lambda t, e: ["replan", "--plan", e["plan"], "--frozen-layers", "1", "--out",
                                              t / "a\nb.json"], 2, "control character"),
    ("newline in export --out", lambda t, e: ["export", "--plan", e["plan"], "--out", t / "ex\nport"], 2,
     "control character"),
    ("export --out /dev/full", lambda t, e: ["export", "--plan", e["plan"], "--out", "/dev/full"], 2,
     "not a folder"),
    # numbers
    ("--p2p-power 1e308", lambda t, e: [*e["frontier"], "--p2p-power", "1e308", "--out", t / "f.json"], 2,
     "--p2p-power"),
    ("frontier --slack-margin 1e308", lambda t, e: ["frontier", "--plan", e["plan"], "--slack-margin", "1e308",
                                                    "--out", t / "f.json"], 2, "at most 100%"),
    ("search --slack-margin 1e308", lambda t, e: [*e["search"], "--slack-margin", "1e308"], 2, "at most 100%"),
    ("dvfs fit --blocking-power 1e308", lambda t, e: ["dvfs", "fit", "--profile", t / "perseus.csv", "--gpu",
                                                      "A100-80GB", "--blocking-power", "1e308"], 2, "5000 W"),
    ("--straggler 1e308", lambda t, e: [*e["frontier"], "--straggler", "1e308", "--out", t / "f.json"], 2,
     "from 1 to 100"),
    ("--max-slowdown 5 reads as 500 %", lambda t, e: [*e["search"], "--objective", "energy", "--max-slowdown", "5"],
     2, "5 reads as 500 %; write 5% (or 0.05)"),
    ("--slack-margin 5 reads as 500 %", lambda t, e: [*e["search"], "--slack-margin", "5"], 2, "write 5% (or 0.05)"),
    ("--max-slowdown 1000% is bounded", lambda t, e: [*e["search"], "--objective", "energy", "--max-slowdown",
                                                      "1000%"], 0, ""),
    # work bounds
    ("frontier --microbatches 10000000", lambda t, e: [*e["frontier"][:-1], "10000000", "--out", t / "f.json"], 2,
     "at most 200000"),
    ("frontier --unit-time 1e-6 on 50000 micro-batches", lambda t, e: [*e["frontier"][:-1], "50000", "--unit-time",
                                                                       "1e-6", "--out", t / "f.json"], 2,
     "or coarser"),
    ("evaluate on 10,000 strategies", lambda t, e: [*e["evaluate"][:-1], t / "10k.json"], 2,
     "10000 strategies; evaluate costs at most 1000"),
    ("a 62 MB JSON array", lambda t, e: [*e["evaluate"][:-1], t / "63mb.json"], 2, "31000000 strategies"),
    ("profile --repeats 1000000000", lambda t, e: ["profile", "--model", "gpt2-tiny", "--repeats", "1000000000",
                                                   "--out", t / "p.csv"], 2, "--repeats"),
    ("profile --mbs 100000000", lambda t, e: ["profile", "--model", "gpt2-tiny", "--mbs", "100000000", "--out",
                                              t / "p.csv"], 2, "GiB"),
    ("profile gpt3-175b on cpu", lambda t, e: ["profile", "--model", "gpt3-175b", "--out", t / "p.csv"], 2,
     "gpt3-175b"),
    # meaning
    *[(f"{cmd}: micro-batch 99 of 8 in a frequency plan", (lambda c: lambda t, e: [*c(t)])(build), 2,
       "micro-batch 99, but the strategy runs 8") for cmd, build in (
        ("evaluate", lambda t: ["evaluate", "--cluster", t / "plan" / "cluster.yaml", "--model", "gpt2-tiny",
                                "--strategy", t / "mb99.json"]),
        ("trial", lambda t: ["trial", "--plan", t / "mb99.json", "--dry-run", "--out", t / "runs"]),
        ("replan", lambda t: ["replan", "--plan", t / "mb99.json", "--frozen-layers", "1"]),
        ("frontier", lambda t: ["frontier", "--plan", t / "mb99.json", "--out", t / "f.json"]),
        ("export", lambda t: ["export", "--plan", t / "mb99.json", "--out", t / "export"]))],
    ("trial --worker 'bad worker;rm'", lambda t, e: ["trial", "--plan", e["plan"], "--dry-run", "--out", t / "runs",
                                                     "--worker", "bad worker;rm"], 2, "dotted module name"),
    ("trial --worker /nonexistent.py", lambda t, e: ["trial", "--plan", e["plan"], "--dry-run", "--out", t / "runs",
                                                     "--worker", "/nonexistent.py"], 2, "no such file"),
    ("dask --scheduler garbage://x", lambda t, e: [*e["search"], "--joblib-backend", "dask", "--scheduler",
                                                   "garbage://x"], 2, "dask"),
]


@pytest.fixture(scope="module")
def edges(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("edges")
    return tmp, _edges(tmp)


@pytest.mark.parametrize("what, build, code, words", EDGE_CASES, ids=[w for w, *_ in EDGE_CASES])
def test_edge_cases_are_one_line_errors(edges, capsys, what, build, code, words):
    tmp, e = edges
    before = sorted(p.name for p in tmp.iterdir())
    got, err = _run(capsys, *build(tmp, e))
    assert got == code, err
    assert words in err, err
    assert sorted(p.name for p in tmp.iterdir()) == before, "an output was (half-)written"
