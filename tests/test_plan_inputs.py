"""Issue 36, item 4: a plan is self-contained. Its input files are recorded relative to its own folder with their
hashes; they are found there whatever the current folder holds; a changed input is named, not silently re-read; a
re-plan written elsewhere records paths that still lead to the same files; older plans still read."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import AMP_PROFILE, SPECS


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """A plan at a/plans/plan.json made from a/het.yaml and a/prof.csv, searched from folder a (once per module)."""
    from ampe.cli import main

    a = tmp_path_factory.mktemp("made") / "a"
    (a / "plans").mkdir(parents=True)
    shutil.copy(SPECS / "amp-het-cluster.yaml", a / "het.yaml")
    shutil.copy(AMP_PROFILE, a / "prof.csv")
    here = os.getcwd()
    os.chdir(a)
    try:
        code = main(["search", "--cluster", "het.yaml", "--model", "gpt2-amp", "--profile", "prof.csv",
                     "--global-batch", "32", "--top-k", "1", "--energy-planner", "none", "--out", "plans/plan.json"])
    finally:
        os.chdir(here)
    assert code == 0
    return a


@pytest.fixture
def made(searched, tmp_path, monkeypatch):
    """The searched folder copied whole (a plan moved with its inputs is still whole); cwd: the copy."""
    a = tmp_path / "a"
    shutil.copytree(searched, a)
    monkeypatch.chdir(a)
    return a / "plans" / "plan.json"


def _inputs(plan: Path) -> dict:
    return json.loads(plan.read_text())["inputs"]


def test_inputs_are_recorded_relative_to_the_plan_with_hashes(made):
    inputs = _inputs(made)
    assert inputs["cluster_spec"] == "../het.yaml" and inputs["profile"] == "../prof.csv"
    assert inputs["relative_to"] == "plan" and set(inputs["sha256"]) == {"cluster_spec", "profile"}
    assert all(len(h) == 64 for h in inputs["sha256"].values())


def test_a_namesake_in_the_current_folder_is_never_read(made, tmp_path, run_cli, monkeypatch):
    other = tmp_path / "other"
    other.mkdir()
    (other / "het.yaml").write_text("not: a spec\n")  # namesakes where the plan's relative paths would lead from here
    (other / "prof.csv").write_text("garbage\n")
    monkeypatch.chdir(other)
    code, _, err = run_cli("replan", "--plan", made, "--frozen-layers", "1")
    assert code == 0, err


def test_a_changed_input_is_named(made, run_cli):
    spec = made.parent.parent / "het.yaml"
    spec.write_text(spec.read_text().replace("inter_gbps: 10", "inter_gbps: 0.01"))  # links 1000x slower
    for argv in (["replan", "--plan", made, "--frozen-layers", "1"], ["frontier", "--plan", made, "--out", "f.json"],
                 ["replan", "--plan", made, "--without", "0"]):
        code, _, err = run_cli(*argv)
        assert code == 2 and "inputs.cluster_spec" in err and "changed since the plan was made" in err, err
        assert len(err.strip().splitlines()) == 1


def test_a_replan_written_elsewhere_leads_to_the_same_files(made, tmp_path, run_cli, monkeypatch):
    elsewhere = tmp_path / "x" / "y"
    elsewhere.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli("replan", "--plan", made, "--frozen-layers", "1", "--out", elsewhere / "re.json")
    assert code == 0, err
    inputs = _inputs(elsewhere / "re.json")
    assert (elsewhere / inputs["profile"]).resolve() == (made.parent.parent / "prof.csv").resolve()
    assert (elsewhere / inputs["cluster_spec"]).resolve() == (made.parent.parent / "het.yaml").resolve()
    assert inputs["sha256"] == _inputs(made)["sha256"]
    code, _, err = run_cli("replan", "--plan", elsewhere / "re.json", "--frozen-layers", "2")
    assert code == 0, err


def test_an_older_plan_without_hashes_still_reads(made, run_cli, monkeypatch):
    doc = json.loads(made.read_text())
    doc["inputs"] = {k: v for k, v in doc["inputs"].items() if k not in ("relative_to", "sha256")}
    doc["inputs"].update(cluster_spec="het.yaml", profile="prof.csv")  # as typed, relative to where search ran
    made.write_text(json.dumps(doc))
    monkeypatch.chdir(made.parent.parent)
    code, _, err = run_cli("replan", "--plan", made, "--frozen-layers", "1")
    assert code == 0, err


def test_an_output_may_not_be_one_of_the_plans_own_inputs(made, run_cli, monkeypatch):
    monkeypatch.chdir(made.parent.parent)
    before = (made.parent.parent / "het.yaml").read_text()
    code, _, err = run_cli("replan", "--plan", made, "--without", "0", "--out", "new.json", "--cluster-out",
                           "het.yaml")
    assert code == 2 and "--cluster-out" in err and "inputs.cluster_spec" in err, err
    assert (made.parent.parent / "het.yaml").read_text() == before
    code, _, err = run_cli("replan", "--plan", made, "--without", "0", "--cluster-out", "c2.yaml")
    assert code == 2 and "only with --out" in err, err


# -- item 5: plan entries' frozen layers and clocks, checked on read and honoured --------------------------------------

def _edit(plan: Path, **entry) -> None:
    doc = json.loads(plan.read_text())
    doc["strategies"][0].update(entry)
    plan.write_text(json.dumps(doc))


def test_an_entrys_frozen_layers_are_honoured_by_evaluate_and_bounded(made, run_cli):
    from ampe.costmodel.cluster import load_cluster
    from ampe.costmodel.estimate import CostModel
    from ampe.costmodel.profile import load_profile
    from ampe.costmodel.strategy import strategy_from_dict
    from ampe.costmodel.zoo import load_model

    _edit(made, frozen_layers=8)
    cluster = load_cluster("het.yaml")
    model = load_model("gpt2-amp")
    entry = json.loads(made.read_text())["strategies"][0]
    want = CostModel(cluster, model.with_frozen_prefix(8), load_profile("prof.csv")).estimate(
        strategy_from_dict(entry, "plan")).iteration_s
    code, _out, err = run_cli("evaluate", "--cluster", "het.yaml", "--model", "gpt2-amp", "--profile", "prof.csv",
                             "--strategy", made, "--json", "e.json")
    assert code == 0, err
    assert json.loads(Path("e.json").read_text())["results"][0]["iteration_s"] == pytest.approx(want, rel=1e-12)
    _edit(made, frozen_layers=99)
    for argv in (["evaluate", "--cluster", "het.yaml", "--model", "gpt2-amp", "--strategy", made],
                 ["replan", "--plan", made, "--frozen-layers", "1"], ["export", "--plan", made, "--out", "exp"]):
        code, _, err = run_cli(*argv)
        assert code == 2 and "frozen_layers" in err and len(err.strip().splitlines()) == 1, err


def test_a_clock_outside_its_gpu_types_range_is_refused_on_read(made, run_cli):
    entry = json.loads(made.read_text())["strategies"][0]
    steps = [[kind, m, 9000] for kind in ("forward", "backward") for m in range(entry["gas"])]
    _edit(made, frequency_plan={"stages": [steps for _ in range(entry["pp"])]})
    for argv in (["replan", "--plan", made, "--frozen-layers", "1"], ["export", "--plan", made, "--out", "exp"],
                 ["frontier", "--plan", made, "--out", "f.json"]):
        code, _, err = run_cli(*argv)
        assert code == 2 and "9000 MHz is outside the clocks" in err and "frequency_plan" in err, err
    assert not Path("exp").exists() and not Path("f.json").exists()
