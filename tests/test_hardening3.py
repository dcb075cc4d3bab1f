"""Issue 36, second pass: progress where bounded work is long (frontier, report --calibrate, the energy phase), an
entry's frozen layers honoured by every scorer of a plan (the plan's own figures are the oracle), and a hand-written
plan's uneven shares that do not divide its batch re-planned, not skipped."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest
from conftest import AMP_PROFILE, ROOT, SPECS

PERSEUS = ROOT / "tests" / "data" / "perseus" / "stage_profile" / "bloom+a40_bf16.csv"


@pytest.fixture(scope="module")
def frozen_plan(tmp_path_factory):
    """``search --frozen-layers 8`` on the AMP cluster (energy planned: its entries carry their pipeline times)."""
    from ampe.cli import main

    a = tmp_path_factory.mktemp("frozen")
    for source, name in ((SPECS / "amp-het-cluster.yaml", "het.yaml"), (AMP_PROFILE, "prof.csv")):
        shutil.copy(source, a / name)
    assert main(["search", "--cluster", str(a / "het.yaml"), "--model", "gpt2-amp", "--profile", str(a / "prof.csv"),
                 "--global-batch", "32", "--top-k", "4", "--frozen-layers", "8", "--out", str(a / "plan.json")]) == 0
    return a


@pytest.fixture
def made(frozen_plan, tmp_path, monkeypatch):
    a = tmp_path / "a"
    shutil.copytree(frozen_plan, a)
    monkeypatch.chdir(a)
    return a / "plan.json"


def _plan(path: Path) -> dict:
    return json.loads(path.read_text())


def _plain_progress(monkeypatch):
    """Plain progress lines from the first update (a pipe; the 5 s wait is what keeps short runs quiet)."""
    import ampe.cli._progress as progress

    monkeypatch.setattr(progress, "PLAIN_AFTER_S", 0.0)


# -- frozen layers: every scorer agrees with the plan's own figures -------------------------------------------------

def test_the_frontier_of_a_frozen_plan_is_the_plans_own(made, run_cli):
    doc = _plan(made)
    assert doc["inputs"]["frozen_layers"] == 8
    want = doc["strategies"][0]["frequency_plan"]
    code, _, err = run_cli("frontier", "--plan", made, "--out", "f.json")
    assert code == 0, err
    chosen = next(p for p in json.loads(Path("f.json").read_text()) if p["chosen"])
    assert chosen["time_s"] == pytest.approx(want["pipeline_time_s"], rel=1e-9)  # was 1.4209 s against 0.8575 s


def test_an_entrys_own_frozen_prefix_is_taken_by_replan(made, run_cli):
    doc = _plan(made)
    doc["inputs"].pop("frozen_layers")
    doc["inputs"].pop("sha256", None)  # the plan file itself is edited, not its inputs
    made.write_text(json.dumps(doc))
    code, out, err = run_cli("replan", "--plan", made, "--without", "0")
    assert code == 0, err
    assert f"{doc['strategies'][0]['predicted']['iteration_s']:.4f} s/iter before" in out


def _lines(doc: dict, frozen: list[int | None]) -> str:
    """Measurement lines of the plan's entries, each measured exactly as predicted."""
    keys = ("pp", "dp", "tp", "mbs", "gbs", "partition", "placement", "schedule", "recompute", "stage_recompute",
            "zero", "attention", "dtype", "tf32", "expandable_segments", "replica_gas")
    out = []
    for e, k in zip(doc["strategies"], frozen, strict=True):
        s = {key: e[key] for key in keys if key in e} | ({"frozen_layers": k} if k is not None else {})
        out.append(json.dumps({"strategy": s, "status": "ok", "iteration_s": e["predicted"]["iteration_s"]}))
    return "\n".join(out) + "\n"


def test_report_and_its_calibration_take_each_lines_frozen_prefix(made, run_cli):
    doc = _plan(made)
    Path("m.jsonl").write_text(_lines(doc, [8] * len(doc["strategies"])))
    code, _, err = run_cli("report", "--measurements", "m.jsonl", "--cluster", "het.yaml", "--model", "gpt2-amp",
                           "--profile", "prof.csv", "--json", "r.json", "--calibrate", "cal.csv")
    assert code == 0, err
    rows = json.loads(Path("r.json").read_text())["trials"]
    assert sorted(r["predicted_s"] for r in rows) == pytest.approx(
        sorted(e["predicted"]["iteration_s"] for e in doc["strategies"]), rel=1e-12)
    fit = json.loads(Path("cal.csv.calibration.json").read_text())["fit"]
    assert fit["mape_before_pct"] == pytest.approx(0.0, abs=1e-9)  # was 77 %: the calibration costed them unfrozen
    Path("m.jsonl").write_text(_lines(doc, [8] * (len(doc["strategies"]) - 1) + [None]))
    code, _, err = run_cli("report", "--measurements", "m.jsonl", "--cluster", "het.yaml", "--model", "gpt2-amp",
                           "--profile", "prof.csv", "--calibrate", "cal2.csv")
    assert code == 2 and "strategy.frozen_layers" in err and "several frozen prefixes (0, 8 layers)" in err, err
    assert not Path("cal2.csv").exists()


def test_a_trial_refuses_an_entry_frozen_otherwise_than_its_plan(made, run_cli):
    doc = _plan(made)
    doc["strategies"][1]["frozen_layers"] = 4
    made.write_text(json.dumps(doc))
    code, _, err = run_cli("trial", "--plan", made, "--dry-run")
    assert code == 2 and "strategies[1].frozen_layers" in err and "differs from the plan's 8" in err, err


def test_a_replan_records_the_prefix_it_was_costed_with(made, run_cli):
    """An entry trained unfrozen in a plan whose inputs say 8 is re-planned unfrozen, and the new plan says so
    (every reader takes ``inputs.frozen_layers`` when an entry has none)."""
    doc = _plan(made)
    doc["strategies"][0]["frozen_layers"] = 0
    doc["inputs"].pop("sha256", None)
    made.write_text(json.dumps(doc))
    code, _, err = run_cli("replan", "--plan", made, "--without", "0", "--out", "re.json")
    assert code == 0, err
    got = _plan(Path("re.json"))
    assert "frozen_layers" not in got["inputs"] and not got.get("frozen_layers")
    assert all(not e.get("frozen_layers") for e in got["strategies"])


@pytest.mark.parametrize("command", [("frontier", "--out", "f.json"), ("replan", "--without", "0")])
def test_a_plans_prefix_beyond_the_model_is_refused_in_one_line(made, run_cli, command):
    doc = _plan(made)
    for e in doc["strategies"]:
        e.pop("frozen_layers", None)
    doc.pop("frozen_layers", None)
    doc["inputs"]["frozen_layers"] = 99
    doc["inputs"].pop("sha256", None)
    made.write_text(json.dumps(doc))
    code, _, err = run_cli(command[0], "--plan", made, *command[1:])
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "inputs.frozen_layers" in err and "99 frozen layers" in err, err


# -- replan: uneven shares that do not divide the batch ---------------------------------------------------------------

def test_replan_keeps_uneven_shares_that_do_not_divide_the_batch(made, run_cli):
    doc = _plan(made)
    doc["strategies"] = [e for e in doc["strategies"] if e["dp"] == 2][:1]
    e = doc["strategies"][0]
    e.update(rank=1, gbs=33, gas=17, replica_gas=[17, 16])
    e.pop("frequency_plan", None)
    doc["global_batch"] = 33
    made.write_text(json.dumps(doc))
    code, out, err = run_cli("replan", "--plan", made, "--slow", f"{e['placement'][0]}=1.01", "--out", "re.json")
    assert code == 0, err
    assert "same degrees, old partition" in out  # was skipped: only dp 1 divides 33
    got = _plan(Path("re.json"))["strategies"][0]
    assert (got["dp"], got["replica_gas"], got["gbs"]) == (2, [17, 16], 33)


# -- progress ---------------------------------------------------------------------------------------------------------

def _rising(calls: list[tuple[float, float]]) -> bool:
    return all(a[0] <= b[0] for a, b in itertools.pairwise(calls))


def _tracked():
    calls: list[tuple[float, float]] = []
    return calls, lambda done, total: calls.append((done, total))


def test_the_frontier_reports_its_trace_and_its_realization():
    from ampe.energy.pipeline_dag import build_dag
    from ampe.energy.profile_csv import load_instruction_profile
    from ampe.tradeoff.frontier import trace_frontier

    profile = load_instruction_profile(PERSEUS, 8)
    dag = build_dag(profile.stage_specs(), 4, blocking_w=[70.0 * g for g in profile.gpus_per_stage])
    traced_calls, traced = _tracked()
    frontier = trace_frontier(dag, 1e-3, progress=traced)
    units = frontier.trace.t_star - frontier.trace.t_min
    assert len(traced_calls) == frontier.trace.max_flows > 1  # one per PD step
    assert traced_calls[-1] == (units, units) and _rising(traced_calls)
    realized_calls, realized = _tracked()
    frontier.points(realized=600, progress=realized)
    assert len(realized_calls) >= 3 and realized_calls[-1][0] == realized_calls[-1][1]
    assert _rising(realized_calls) and all(d <= t for d, t in realized_calls)


def test_frontier_shows_progress_on_stderr(made, run_cli, monkeypatch):
    _plain_progress(monkeypatch)
    code, out, err = run_cli("frontier", "--profile", PERSEUS, "--stages", "8", "--microbatches", "4",
                             "--out", "p.json")
    assert code == 0, err
    tracing = [line for line in err.splitlines() if line.startswith("ampe frontier: tracing ")]
    realizing = [line for line in err.splitlines() if line.startswith("ampe frontier: realizing ")]
    assert len(tracing) >= 2 and "units of τ" in tracing[-1] and len(realizing) >= 2 and "points" in realizing[-1]
    assert "ampe frontier:" not in out  # stdout keeps the results
    code, _, err = run_cli("frontier", "--plan", made, "--out", "f.json")
    assert code == 0, err
    assert any(line.startswith("ampe frontier: tracing and realizing 100%") for line in err.splitlines()), err


def test_calibration_shows_its_leave_one_out_fits(made, run_cli, monkeypatch):
    _plain_progress(monkeypatch)
    doc = _plan(made)
    Path("m.jsonl").write_text(_lines(doc, [8] * len(doc["strategies"])))
    code, _, err = run_cli("report", "--measurements", "m.jsonl", "--cluster", "het.yaml", "--model", "gpt2-amp",
                           "--profile", "prof.csv", "--calibrate", "cal.csv")
    assert code == 0, err
    lines = [line for line in err.splitlines() if line.startswith("ampe report: calibrating ")]
    assert len(lines) >= 2 and "leave-one-out fits" in lines[-1]
    done, total = lines[-1].split(" ")[3].split("/")
    assert done == total and int(total) % len(doc["strategies"]) == 0  # structures × held-out strategies


def test_the_energy_phase_reports_within_a_strategy_and_per_task_in_parallel(made):
    from joblib import parallel_backend

    from ampe.cli._planio import load_plan_inputs, strategy_at_rank
    from ampe.costmodel.estimate import CostModel
    from ampe.energy.ranking import rank_strategies

    doc, cluster, model, profile = load_plan_inputs(str(made))
    cm = CostModel(cluster, model.with_frozen_prefix(8), profile)
    ests = [cm.estimate(strategy_at_rank(doc, str(made), e.rank, cluster, model)) for e in doc.strategies]
    serial, report = _tracked()
    rank_strategies(ests, cluster, top_k=4, progress=report)
    assert len(serial) > 2 * len(ests)  # inside each strategy's planning too, not once per strategy
    assert serial[-1][0] == serial[-1][1] and _rising(serial)
    parallel, report = _tracked()
    with parallel_backend("threading"):
        rank_strategies(ests, cluster, top_k=4, jobs=2, progress=report)
    finished = sorted({d for d, _ in parallel})
    assert len(finished) >= len(ests)  # each planned strategy counted as it came back


def test_export_again_leaves_no_replica_configs_of_an_earlier_export(tmp_path, run_cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("train.py").write_text("print('train')\n")
    code, _, err = run_cli("search", "--cluster", SPECS / "local-cpu.yaml", "--model", "gpt2-tiny", "--global-batch",
                           "8", "--energy-planner", "none", "--out", "plan.json")
    assert code == 0, err
    doc = _plan(Path("plan.json"))
    entry = next(e for e in doc["strategies"] if e["dp"] == 2 and e["mbs"] == 1)
    doc["strategies"] = [{**entry, "rank": 1, "replica_gas": [5, 3], "gas": 5}]
    Path("uneven.json").write_text(json.dumps(doc))
    doc["strategies"] = [{**entry, "rank": 1}]
    Path("even.json").write_text(json.dumps(doc))
    victim = tmp_path / "victim.json"
    victim.write_text("precious")
    out = tmp_path / "ex"
    assert run_cli("export", "--plan", "uneven.json", "--out", out)[0] == 0
    assert [json.loads((out / f"ds_config_replica{r}.json").read_text())["gradient_accumulation_steps"]
            for r in range(2)] == [5, 3]
    (out / "ds_config_replica7.json").symlink_to(victim)  # a stray link among them: unlinked, never followed
    code, _, err = run_cli("export", "--plan", "even.json", "--out", out)
    assert code == 0, err
    assert not list(out.glob("ds_config_replica*")) and victim.read_text() == "precious"
    assert (out / "ds_config.json").is_file()


def test_search_on_the_multiprocessing_backend_gives_the_serial_plan(tmp_path, run_cli):
    """joblib's multiprocessing backend hands results back all at once (no return_as="generator"): the search and
    its energy planning take them so (it was a ValueError traceback) and plan as the serial run does."""
    plans = []
    for extra in ([], ["--jobs", "2", "--joblib-backend", "multiprocessing"]):
        out = tmp_path / f"p{len(plans)}.json"
        code, _, err = run_cli("search", "--cluster", SPECS / "local-cpu.yaml", "--model", "gpt2-tiny",
                               "--global-batch", "8", "--objective", "energy", "--out", out, *extra)
        assert code == 0, err
        plans.append([{k: v for k, v in s.items() if k != "predicted"} for s in _plan(out)["strategies"]])
    assert plans[0] == plans[1]
