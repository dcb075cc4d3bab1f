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
    (tmp / "63mb.json").write_text("[" + ",".join(["0"] * 31_000_000) + "]")  # 62 MB: refused before parsing
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
    ("symlink loop as --out", lambda t, e: [*e["search"], "--out", t / "loop1"], 2, "is a symbolic link"),
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
    ("a 62 MB JSON array", lambda t, e: [*e["evaluate"][:-1], t / "63mb.json"], 2,
     "about 31,000,001 JSON values; ampe reads at most 8,000,000"),
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


# Issue 26, items 2 and 3: readers bounded by work, the documented maxima, plausible numbers, consistency. One
# reproducer per site; each must end with exit 2 and one line saying the words listed, in bounded time and memory
# (every case here takes under about two seconds on a busy two-core machine; the big files are written only by the
# case that reads them, into ``big/``).
_BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))  # 342 bytes, 9^9


def _yaml_edit(base: Any, **changes: Any) -> str:
    return yaml.safe_dump({**base, **changes})


def _gpu(**fields: Any) -> dict[str, Any]:
    return {**CLUSTER, "gpu_types": {"cpu2": {"base": "cpu", "memory_gb": 8, **fields}}}


def _node(**fields: Any) -> dict[str, Any]:
    return {**CLUSTER, "nodes": [{**CLUSTER["nodes"][0], **fields}]}


def _readers(tmp: Path) -> dict[str, Any]:
    """The small inputs of the issue-26 cases (in ``tmp``, next to the good ones of :func:`_inputs`)."""
    argv = _inputs(tmp / "good")
    files = {
        "bomb.yaml": _BOMB,
        "dup.yaml": "name: fz\nnodes:\n- {name: h, gpu: cpu, count: 2, intra_gbps: 40, inter_gbps: 40}\nname: fz2\n",
        "sexagesimal.yaml": _yaml_edit(_node(count="@")).replace("'@'", "1:30"),
        "digits.yaml": _yaml_edit(CLUSTER, latency_us=0).replace("latency_us: 0", "latency_us: " + "9" * 5000),
        "latency.yaml": _yaml_edit(CLUSTER, latency_us=1e12),
        "tiny_gbps.yaml": _yaml_edit(_node(intra_gbps=1e-300)),
        "denormal_gbps.yaml": _yaml_edit(_node(inter_gbps=5e-324)),
        "tflops.yaml": _yaml_edit(_gpu(peak_tflops_fp16=1e300)),
        "overhead.yaml": _yaml_edit(_gpu(layer_overhead_s=1e9)),
        "memory.yaml": _yaml_edit(_gpu(memory_gb=1e308)),
        "power.yaml": _yaml_edit(_gpu(dvfs={"compute_share": 0.5, "static_share": 0.1, "busy_w": 1,
                                            "blocking_w": 500})),
        "c16.yaml": _yaml_edit(_node(count=8, repeat=2)),
        "heads.yaml": _yaml_edit({**MODEL, "heads": 5}),
        "base_heads.yaml": "base: gpt2-tiny\nheads: 3\n",
        "tied.yaml": _yaml_edit({**MODEL, "layers": [MODEL["layers"][0], MODEL["layers"][1],
                                                     {**MODEL["layers"][2], "params": 4000}]}),
        "10k.yaml": "base: gpt2-tiny\nlayers: 10000\n",
        "hf.json": json.dumps({"model_type": "llama", "num_hidden_layers": 10**9, "hidden_size": 64,
                               "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100}),
        "dup.json": '{"pp": 2, "dp": 1, "tp": 1, "mbs": 1, "gbs": 4,\n "partition": [0, 2, 4], "pp": 1}',
        "digits.json": json.dumps(STRATEGY)[:-1] + ', "gbs2": ' + "9" * 5000 + "}",
        "gbs.json": json.dumps({**STRATEGY, "gbs": 2**22}),
        "hosts.yaml": _BOMB,
        "meas.jsonl": json.dumps({"strategy": STRATEGY, "iteration_s": 0.5,
                                  "status": "ok"}) + "\n",
        "dupmeas.jsonl": json.dumps({"strategy": STRATEGY, "iteration_s": 0.5, "status": "ok"})[:-1]
        + ', "status": "oom"}\n',
        "flat.csv": "stage,instruction,frequency,time,energy\n" + "".join(
            f"0,{i},{f},0.1,20\n" for i in ("forward", "backward") for f in (1000, 1200, 1410)),
    }
    for name, text in files.items():
        (tmp / name).write_text(text)
    plan = write_plan(tmp / "plan", four_strategies())
    doc = json.loads(plan.read_text())
    doc["strategies"][0]["predicted"]["iteration_s"] = 1e-300
    (tmp / "fast_plan.json").write_text(json.dumps(doc))
    runs = tmp / "runs"
    runs.mkdir()
    (runs / "plan.json").write_text(plan.read_text())
    from ampe.formats.trial import TrialResult

    good = TrialResult(key="k", trial_id="t", plan_rank=1, strategy=four_strategies()[0], model="gpt2-tiny",
                       cluster="cpu2", freq_backend="none", schedule_applied=False, warmup_iters=1, timed_iters=3,
                       status="ok", iteration_s=(0.02, 0.021), iteration_s_mean=0.0205).to_dict()
    (runs / "results.jsonl").write_text(json.dumps({**good, "iteration_s_mean": 5.0}) + "\n")
    (tmp / "big").mkdir()
    return {"evaluate": argv, "plan": plan}


def _big(t: Path, name: str, text: str) -> Path:
    path = t / "big" / name
    path.write_text(text)
    return path


def _cluster(t: Path, e: dict[str, Any], spec: str | Path) -> list[Any]:
    argv = list(e["evaluate"])
    argv[argv.index("--cluster") + 1] = t / spec
    return argv


def _model(t: Path, e: dict[str, Any], model: str | Path) -> list[Any]:
    argv = list(e["evaluate"])
    argv[argv.index("--model") + 1] = t / model
    return argv


def _strategy(t: Path, e: dict[str, Any], strategy: str | Path) -> list[Any]:
    return [*e["evaluate"][:-1], t / strategy]


_ROW = "  - [" + ",".join(["0.5"] * 100) + "]\n"
ISSUE_26: list[tuple[str, Any, str]] = [
    # item 2: readers bounded by work
    ("alias bomb as cluster spec", lambda t, e: _cluster(t, e, "bomb.yaml"), "YAML nodes (aliases counted in full)"),
    ("alias bomb as model", lambda t, e: _model(t, e, "bomb.yaml"), "YAML nodes (aliases counted in full)"),
    ("alias bomb as host map", lambda t, e: ["export", "--plan", e["plan"], "--host-map", t / "hosts.yaml", "--out",
                                             t / "big" / "export"], "YAML nodes (aliases counted in full)"),
    ("duplicate YAML key", lambda t, e: _cluster(t, e, "dup.yaml"), "line 4: key 'name' appears twice"),
    ("duplicate JSON key", lambda t, e: _strategy(t, e, "dup.json"), "line 1: key 'pp' appears twice"),
    ("duplicate JSON key in a measurements line", lambda t, e: [
        "report", "--measurements", t / "dupmeas.jsonl", "--cluster", t / "good" / "c.yaml", "--model",
        t / "good" / "m.yaml"], "dupmeas.jsonl:1: key 'status' appears twice"),
    ("a YAML matrix of 900,000 numbers", lambda t, e: _cluster(t, e, _big(t, "matrix.yaml", "name: x\nextra:\n"
                                                                          + _ROW * 9_000)),
     "more than 250,000 YAML nodes"),
    ("60 MB YAML comment", lambda t, e: _cluster(t, e, _big(t, "comment.yaml", "#" + "x" * 60_000_000 + "\n")),
     "larger than 8 MiB"),
    ("a 2-million-item plan list", lambda t, e: ["trial", "--plan", _big(
        t, "list.json", '{"strategies": [' + ",".join(["12345678"] * 2_000_000) + "]}"), "--dry-run", "--out",
        t / "big" / "runs"], "schema"),
    ("300,000 CSV rows", lambda t, e: [*e["evaluate"][:-2], "--profile", _big(
        t, "rows.csv", "model,device,tp,mbs,layer,forward_s,backward_s\n" + "m4,cpu,1,1,0,0.001,0.002\n" * 300_000),
        "--strategy", e["evaluate"][-1]], "at most 200,000 rows"),
    ("5,000-digit integer in YAML", lambda t, e: _cluster(t, e, "digits.yaml"), "an integer of 5,000 characters"),
    ("5,000-digit integer in JSON", lambda t, e: _strategy(t, e, "digits.json"), "more than 4,000 digits"),
    ("count: 1:30 is not 90", lambda t, e: _cluster(t, e, "sexagesimal.yaml"), "nodes[0].count"),
    ("10,000 layers: the DP's table", lambda t, e: ["search", "--cluster", t / "c16.yaml", "--model", t / "10k.yaml",
                                                   "--global-batch", "16"], "exact partition needs"),
    ("global batch 2^22 simulated", lambda t, e: [*_strategy(t, e, "gbs.json"), "--method", "simulate"],
     "operations to simulate"),
    ("HF config with 10^9 layers", lambda t, e: _model(t, e, "hf.json"), "num_hidden_layers: must be an integer in "
     "1..100000"),
    # item 3: plausible numbers, consistency
    ("latency 1e12 µs", lambda t, e: _cluster(t, e, "latency.yaml"), "latency_us: 1e+12 µs is outside 0 to"),
    ("1e-300 Gbit/s", lambda t, e: _cluster(t, e, "tiny_gbps.yaml"), "intra_gbps: 1e-300 Gbit/s is outside 0.001 to"),
    ("5e-324 Gbit/s", lambda t, e: _cluster(t, e, "denormal_gbps.yaml"), "Gbit/s (link bandwidth)"),
    ("1e300 TFLOPS", lambda t, e: _cluster(t, e, "tflops.yaml"), "TFLOP/s (peak compute)"),
    ("layer_overhead_s 1e9", lambda t, e: _cluster(t, e, "overhead.yaml"), "layer_overhead_s: 1e+09 s is outside 0 "
     "to 10 s"),
    ("memory 1e308 GB", lambda t, e: _cluster(t, e, "memory.yaml"), "GB (device memory)"),
    ("busy_w 1 W beside blocking_w 500 W", lambda t, e: _cluster(t, e, "power.yaml"), "above busy_w 1 W"),
    ("heads that do not divide hidden", lambda t, e: _model(t, e, "heads.yaml"), "heads: 5 does not divide hidden"),
    ("base: heads that do not divide hidden", lambda t, e: _model(t, e, "base_heads.yaml"), "does not divide"),
    ("tied layers with different sizes", lambda t, e: _model(t, e, "tied.yaml"), "tied layers share one weight"),
    ("predicted.iteration_s 1e-300", lambda t, e: ["trial", "--plan", t / "fast_plan.json", "--dry-run", "--out",
                                                   t / "big" / "runs"], "(iteration time)"),
    ("2-device measurements without placement on a 16-device cluster", lambda t, e: [
        "report", "--measurements", t / "meas.jsonl", "--cluster", t / "c16.yaml", "--model", t / "good" / "m.yaml"],
     "2 devices ran, but the cluster has 16"),
    ("results.jsonl mean against its samples", lambda t, e: ["report", t / "runs"], "the record contradicts itself"),
    ("dvfs fit on a flat sweep", lambda t, e: ["dvfs", "fit", "--profile", t / "flat.csv", "--gpu", "A100-80GB"],
     "cannot be identified"),
]


@pytest.fixture(scope="module")
def readers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("readers")
    return tmp, _readers(tmp)


@pytest.mark.parametrize("what, build, words", ISSUE_26, ids=[w for w, *_ in ISSUE_26])
def test_issue_26_readers_and_numbers_are_one_line_errors(readers, capsys, what, build, words):
    tmp, e = readers
    before = sorted(p.name for p in tmp.iterdir())
    got, err = _run(capsys, *build(tmp, e))
    assert got == 2, err
    assert words in err, err
    assert sorted(p.name for p in tmp.iterdir()) == before, "an output was (half-)written"
    for big in (tmp / "big").iterdir():  # the next case starts without this one's big file
        if big.is_file():
            big.unlink()
