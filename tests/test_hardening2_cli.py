"""Issue 36, item 5 (command options checked for sense): ``dvfs fit`` writes only what the spec loader takes,
``frontier`` refuses a unit time that floors times to 0 and a blocking power above computing power, ``export`` and
``trial --cluster`` refuse GPU types the plan was not made for and NVML on CPUs, host names are bounded."""

from __future__ import annotations

import pytest
from conftest import ROOT, SPECS

PERSEUS = ROOT / "tests" / "data" / "perseus" / "stage_profile" / "gpt3-175b+a40_bf16.csv"


def _scaled(tmp_path, t: float, e: float):
    rows = PERSEUS.read_text().splitlines()
    p = tmp_path / f"s{t}-{e}.csv"
    p.write_text("\n".join([rows[0]] + [",".join([*r.split(",")[:3], repr(float(r.split(",")[3]) * t),
                                                   repr(float(r.split(",")[4]) * e)]) for r in rows[1:]]) + "\n")
    return p


@pytest.mark.parametrize(("t", "e", "gpus", "words"), [(1e308, 1, "1", "the fit failed"),
                                                      (1, 1e-3, "1", "blocking_w"), (1, 1, "100000", "busy_w")])
def test_dvfs_fit_never_writes_what_the_loader_refuses(tmp_path, run_cli, t, e, gpus, words):
    out = tmp_path / "o.yaml"
    code, _, err = run_cli("dvfs", "fit", "--profile", _scaled(tmp_path, t, e), "--gpu", "A40", "--gpus", gpus,
                           "--out", out)
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


@pytest.mark.parametrize(("extra", "flag"), [(["--floor-times", "--unit-time", "10"], "--unit-time"),
                                             (["--p2p-power", "2000"], "--p2p-power")])
def test_frontier_options_that_make_no_sense_are_refused(tmp_path, run_cli, extra, flag):
    code, _, err = run_cli("frontier", "--profile", PERSEUS, "--stages", "8", "--microbatches", "4", *extra,
                           "--out", tmp_path / "f.json")
    assert code == 2 and flag in err and len(err.strip().splitlines()) == 1, err


@pytest.fixture(scope="module")
def cpu_plan(tmp_path_factory):
    from ampe.cli import main

    plan = tmp_path_factory.mktemp("cpu") / "plan.json"
    assert main(["search", "--cluster", str(SPECS / "local-cpu.yaml"), "--model", "gpt2-tiny", "--global-batch", "4",
                 "--top-k", "1", "--out", str(plan)]) == 0
    return plan


@pytest.mark.parametrize("command", ["export", "trial"])
def test_a_cluster_of_gpu_types_the_plan_was_not_made_for_is_refused(cpu_plan, tmp_path, run_cli, command):
    extra = ["--dry-run"] if command == "trial" else []
    code, _, err = run_cli(command, "--plan", cpu_plan, "--cluster", SPECS / "amp-het-cluster.yaml", "--out",
                           tmp_path / "o", *extra)
    assert code == 2 and "--cluster" in err and "not made for" in err, err
    code, _, err = run_cli(command, "--plan", cpu_plan, "--freq-backend", "nvml", "--out", tmp_path / "o", *extra)
    assert code == 2 and "--freq-backend" in err and "CPUs" in err, err
    assert not (tmp_path / "o").exists()


def test_host_names_are_bounded():
    from ampe.trials.hostfile import _HOSTNAME

    for name in ("a" * 63, "10.0.0.1", "node-1.cluster.local", ".".join(["a" * 50] * 4)):
        assert _HOSTNAME.match(name), name
    for name in ("a" * 64, "a" * 300, ".".join(["a" * 63] * 4), "a..b", "a b", "$(x)", ""):
        assert not _HOSTNAME.match(name), name
