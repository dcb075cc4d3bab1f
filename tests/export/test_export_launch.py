"""The exported launches, run for real on this machine's CPUs (world size 2, a few iterations, gloo):

* one host: the exported ``launch.sh`` (torchrun) runs the user-style MLP script; its measurements go to
  ``ampe report --measurements``;
* two emulated hosts (``localhost`` and ``127.0.0.2``, both loopback): the exported multi-node launch through
  DeepSpeed's own runner, with pdsh/ssh replaced by ``tests/support/fake_hosts`` (each "host" runs in its own UTS
  namespace named after it, with a login-like environment), for the user-style script and for ampe's worker; every
  rank must land on the host the export names, and rank 0 on the master address;
* the same launch with the hostfile order swapped, or the master address pointing at the other host, must fail.

No timing is asserted (a shared 2-core machine). On a cold machine the first launch builds DeepSpeed's CPU comm op
(``launch.sh`` runs ``python -m ampe.runtime.prebuild`` before the ranks; ``make test`` builds it before the tests).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from ampe.costmodel.training import optimizer_config, optimizer_label
from ampe.formats.export import ExportFile
from ampe.trials import process
from ampe.trials.commands import Launch, free_port
from tests.export.support import FAKE_HOSTS, MLP, ROOT, USER_SCRIPT, ampe, emulation_available, pick, two_host_plan

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.trial

WARMUP, ITERS = 1, 3
LIMIT_S = 540.0  # per launch; on a cold machine the first one builds DeepSpeed's shm comm op first (minutes)
MEASUREMENT_KEYS = {"strategy", "iteration_s", "status", "peak_memory_bytes", "energy_j", "energy_source"}
STRATEGY_KEYS = {"pp", "dp", "tp", "mbs", "gbs", "partition", "placement", "schedule", "attention", "dtype",
                 "tf32", "recompute", "zero"}


def launch(script: Path, *args: str, emulated: bool = False, limit_s: float = LIMIT_S) -> tuple[int | None, str]:
    """Run an exported launch script; (exit status or None if it had to be killed, its log)."""
    env = {}
    if emulated:
        env = {"PATH": f"{FAKE_HOSTS}{os.pathsep}{os.environ['PATH']}", "FAKE_SSH_ENV": "TORCH_EXTENSIONS_DIR"}
    log = script.parent / f"{script.stem}.log"
    procs = process.start(Launch("deepspeed", ("/bin/sh", str(script), *args), env, 2), log)
    deadline = time.monotonic() + limit_s
    try:
        while not procs.poll():
            if time.monotonic() > deadline:
                procs.kill(grace_s=2.0)
                break
            time.sleep(0.2)
    finally:
        if not procs.poll():
            procs.kill(grace_s=2.0)
        procs.close()
    code = procs.returncodes()[0]
    return code, log.read_text(errors="replace")


def export(plan: Path, out: Path, *extra: object) -> ExportFile:
    code, _, err = ampe("export", "--plan", plan, "--out", out, "--master-port", free_port(), *extra)
    assert code == 0, err
    return ExportFile.parse(json.loads((out / "export.json").read_text()), "export.json")


def measurements(path: Path) -> list[dict]:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    for line in lines:
        assert set(line) <= MEASUREMENT_KEYS and set(line["strategy"]) == STRATEGY_KEYS
    return lines


def user_reports(folder: Path, n: int) -> list[dict]:
    return [json.loads((folder / f"user_rank{r}.json").read_text()) for r in range(n)]


# --- one host -----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def one_host(tmp_path_factory):
    from conftest import SPECS

    tmp = tmp_path_factory.mktemp("one_host")
    plan = tmp / "plan.json"
    code, _, err = ampe("search", "--cluster", SPECS / "local-cpu.yaml", "--model", MLP, "--global-batch", "8",
                        "--pp", "2", "--top-k", "4", "--out", plan)
    assert code == 0, err
    out = tmp / "exp"
    e = export(plan, out, "--rank", pick(plan, frequency_plan=True), "--script", USER_SCRIPT)
    code, log = launch(out / "launch.sh", "--warmup", str(WARMUP), "--iters", str(ITERS), "--report-dir", str(out))
    assert code == 0, log[-3000:]
    return plan, out, e


def test_user_script_trains_under_the_exported_plan_and_records_measurements(one_host):
    _, out, e = one_host
    [line] = measurements(out / "measurements.jsonl")  # one line per run
    assert line["status"] == "ok" and line["iteration_s"] > 0
    assert line["strategy"] == {**{"recompute": "none", "zero": 0}, **{k: e.strategy[k] for k in STRATEGY_KEYS
                                                                      if k in e.strategy}}
    assert line["peak_memory_bytes"] > 0 and line["energy_j"] > 0  # traced tensors; modelled energy on CPU
    reports = user_reports(out, 2)
    for r, rep in enumerate(reports):
        assert rep["layers"] == e.parts[rep["stage"]:rep["stage"] + 2] and rep["stage"] == r
        assert rep["backend"] == "emulate" and rep["instructions_ok"], rep["mismatch"]
        assert rep["applied_steps"] == rep["plan_steps"] * (WARMUP + ITERS) > 0  # every planned clock, every iter
        assert len(rep["iteration_s"]) == ITERS and len(rep["energy_j"]) == ITERS
    # the line's time is the slowest rank's, per iteration, averaged
    slowest = [max(a, b) for a, b in zip(reports[0]["iteration_s"], reports[1]["iteration_s"], strict=True)]
    assert line["iteration_s"] == pytest.approx(sum(slowest) / ITERS)
    losses = reports[-1]["losses"]
    assert min(losses[1:]) < losses[0]  # gradients reach every stage
    # one optimizer everywhere: the exported config names torch's fused AdamW, and the user's script ran it
    assert optimizer_label(e.deepspeed) == "torch.optim.AdamW(fused)"
    assert {rep["optimizer"] for rep in reports} == {optimizer_label(e.deepspeed)}
    assert json.loads((out / "ds_config.json").read_text())["optimizer"] == optimizer_config()


def test_a_tp2_llama_export_trains_ampes_sharded_layers_in_a_user_script(tmp_path):
    """``plan.model_layer_specs()`` shards ampe's Llama layers over the rank's tensor-parallel group and
    ``plan.model_loss()`` is the vocab-parallel loss: a tp-2 plan of llama-tiny trains in a user's script
    (benchmarks/support/train_exported.py) and records its measurements line."""
    from conftest import SPECS

    plan = tmp_path / "plan.json"
    code, _, err = ampe("search", "--cluster", SPECS / "local-cpu.yaml", "--model", "llama-tiny", "--global-batch",
                        "4", "--pp", "1", "--top-k", "20", "--energy-planner", "none", "--out", plan)
    assert code == 0, err
    out = tmp_path / "exp"
    e = export(plan, out, "--rank", pick(plan, tp=2), "--script", ROOT / "benchmarks" / "support" /
               "train_exported.py")
    assert e.strategy["tp"] == 2
    report = out / "user_script.json"
    code, log = launch(out / "launch.sh", "--warmup", "1", "--iters", "2", "--report", str(report))
    assert code == 0, log[-3000:]
    rep = json.loads(report.read_text())
    assert rep["strategy"]["tp"] == 2 and len(rep["losses"]) == 3 and all(0 < x < 20 for x in rep["losses"])
    [line] = measurements(out / "measurements.jsonl")
    assert line["status"] == "ok" and line["strategy"]["tp"] == 2


def test_measurements_go_back_through_ampe_report_and_calibrate_the_search(one_host, tmp_path):
    """plan → user script → measurements → ampe report → calibrated search (issue 15's round trip)."""
    plan, out, e = one_host
    # a second measured strategy of the same plan, into the same file (the recorder appends)
    other = pick(plan, frequency_plan=False)
    out2 = tmp_path / "exp2"
    export(plan, out2, "--rank", other, "--script", USER_SCRIPT)
    code, log = launch(out2 / "launch.sh", "--iters", str(ITERS), "--report-dir", str(out2))
    assert code == 0, log[-3000:]
    data = tmp_path / "measurements.jsonl"
    data.write_text((out / "measurements.jsonl").read_text() + (out2 / "measurements.jsonl").read_text())
    assert len(measurements(data)) == 2
    cal = tmp_path / "calibrated.csv"
    code, _, err = ampe("report", "--measurements", data, "--cluster", e.cluster_spec, "--model", e.model,
                        "--calibrate", cal)
    assert code == 0, err
    code, _, err = ampe("search", "--cluster", e.cluster_spec, "--model", e.model, "--profile", cal,
                        "--global-batch", "8", "--top-k", "2", "--out", tmp_path / "calibrated_plan.json")
    assert code == 0, err


# --- two emulated hosts -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hosts_ok():
    why = emulation_available()
    if why:
        pytest.skip(why)


@pytest.fixture(scope="module")
def mlp_plan(tmp_path_factory, hosts_ok):
    return two_host_plan(tmp_path_factory.mktemp("two_hosts"))


def test_user_script_runs_across_two_emulated_hosts(mlp_plan, tmp_path):
    out = tmp_path / "exp"
    e = export(mlp_plan, out, "--rank", pick(mlp_plan, frequency_plan=True), "--host-map",
               mlp_plan.parent / "hosts.yaml", "--script", USER_SCRIPT)
    assert e.launcher == "deepspeed" and [r.host for r in e.ranks] == ["localhost", "127.0.0.2"]
    code, log = launch(out / "launch.sh", "--iters", str(ITERS), "--report-dir", str(out), emulated=True)
    assert code == 0, log[-3000:]
    assert "pdsh" in log and "node_rank=%n" in log  # DeepSpeed's multi-node path, not its local one
    for rank, rep in enumerate(user_reports(out, 2)):
        assert rep["host"] == e.ranks[rank].host  # the UTS hostname of the emulated host it was sent to
        assert rep["master_addr"] == e.master_addr == e.ranks[0].host
        assert rep["layers"] == e.parts[rank:rank + 2] and rep["instructions_ok"]
    [line] = measurements(out / "measurements.jsonl")
    assert line["status"] == "ok" and line["iteration_s"] > 0


def test_ampe_worker_runs_across_two_emulated_hosts(tmp_path, hosts_ok):
    plan = two_host_plan(tmp_path / "plan", model="gpt2-tiny", gbs=4)
    out = tmp_path / "exp"
    e = export(plan, out, "--host-map", plan.parent / "hosts.yaml", "--warmup", "1", "--iters", "2")
    code, log = launch(out / "launch_worker.sh", emulated=True)
    assert code == 0, log[-3000:]
    result = json.loads((out / "worker" / "result.json").read_text())
    assert result["status"] == "ok" and len(result["iteration_s"]) == 2
    for rank, rep in enumerate(result["ranks"]):
        assert rep["host"] == e.ranks[rank].host
        assert rep["layers"] == e.parts[rank:rank + 2]
    assert result["host_other_cores"] is None  # the worker saw two hosts


def test_ampe_trial_runs_across_two_emulated_hosts(tmp_path, hosts_ok, monkeypatch):
    """The trial runner's own multi-host path (``ampe trial --host-map``), through the same fake hosts."""
    plan = two_host_plan(tmp_path / "plan", model="gpt2-tiny", gbs=4)
    monkeypatch.setenv("PATH", f"{FAKE_HOSTS}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SSH_ENV", "TORCH_EXTENSIONS_DIR")
    runs = tmp_path / "runs"
    code, _, err = ampe("trial", "--plan", plan, "--top-k", "1", "--warmup", "1", "--iters", "2", "--host-map",
                        plan.parent / "hosts.yaml", "--freq-backend", "none", "--timeout", str(LIMIT_S), "--out",
                        runs, "--progress", "none")
    [line] = [json.loads(x) for x in (runs / "results.jsonl").read_text().splitlines()]
    log = Path(line["job_dir"], "launcher.log").read_text(errors="replace")
    assert code == 0 and line["status"] == "ok", (err, line["reason"], log[-3000:])
    assert "node_rank=%n" in log and "export DS_ACCELERATOR=cpu" in log  # .deepspeed_env reached every host
    hosts = [json.loads(Path(line["job_dir"], f"rank{r}.json").read_text())["host"] for r in range(2)]
    assert hosts == ["localhost", "127.0.0.2"]


def test_swapped_rank_to_host_map_fails(mlp_plan, tmp_path):
    out = tmp_path / "exp"
    e = export(mlp_plan, out, "--host-map", mlp_plan.parent / "hosts.yaml", "--script", USER_SCRIPT)
    hostfile = out / "hostfile"
    hostfile.write_text("".join(reversed(hostfile.read_text().splitlines(keepends=True))))
    code, log = launch(out / "launch.sh", "--report-dir", str(out), "--timeout-s", "30", emulated=True)
    assert code not in (0, None), log[-3000:]
    assert "PlacementError" in log
    reports = user_reports(out, 2)
    assert reports[0]["host"] == "127.0.0.2" != e.ranks[0].host  # DeepSpeed followed the hostfile, not the plan


def test_master_address_off_rank_0s_host_fails(mlp_plan, tmp_path):
    out = tmp_path / "exp"
    e = export(mlp_plan, out, "--host-map", mlp_plan.parent / "hosts.yaml", "--script", USER_SCRIPT)
    script = out / "launch.sh"
    script.write_text(script.read_text().replace(f"--master_addr {e.master_addr}", "--master_addr 127.0.0.2"))
    code, log = launch(script, "--report-dir", str(out), "--timeout-s", "6", emulated=True)
    assert code not in (0, None), log[-3000:]
    assert "MASTER_ADDR='127.0.0.2' names another host" in log
