"""Fault handling of the trial runner with the fake worker: OOM, hang, killed rank, crash, SIGINT, resume, budget."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ampe import jitops
from ampe.report.compare import build_report
from ampe.trials.results import ResultsStore
from ampe.trials.runner import run_trials
from tests.support.trial_fixtures import (
    FAKE_WORKER,
    control,
    four_strategies,
    options,
    processes_mentioning,
    strategy,
    write_plan,
)

MiB = 1 << 20


def _jsonl(out: Path) -> list[dict]:
    """Every line of results.jsonl parsed strictly (fails on any invalid line)."""
    text = (out / "results.jsonl").read_text()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def test_oom_under_memory_limit_is_recorded_and_resume_skips_it(tmp_path):
    plan = write_plan(tmp_path, four_strategies())
    env = control(pp2dp1tp1mbs2={"mode": "oom", "alloc_bytes": 1 << 30})
    out = tmp_path / "out"
    results = run_trials(plan, options(out, memory_limit_bytes=256 * MiB, env=env))
    status = {r.plan_rank: r.status for r in results}
    assert status == {1: "ok", 2: "oom", 3: "ok", 4: "ok"}
    oom = results[1]
    assert "MemoryError" in oom.reason and oom.failed_rank is not None
    assert oom.iteration_s_mean is None
    lines = _jsonl(out)
    assert [l["status"] for l in lines] == ["ok", "oom", "ok", "ok"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"] == {"ok": 3, "oom": 1}
    assert (out / "summary.csv").read_text().count("\n") == 5  # header + 4 trials

    # Resume: nothing runs again (the stored records come back unchanged, no new lines).
    again = run_trials(plan, options(out, memory_limit_bytes=256 * MiB, env=env))
    assert [r.started_at for r in again] == [r.started_at for r in results]
    assert len(_jsonl(out)) == 4

    # The limit is what made it fail: without it the same strategy runs.
    free = run_trials(plan, options(tmp_path / "free", env=env, top_k=2))
    assert [r.status for r in free] == ["ok", "ok"]


def test_hung_rank_times_out_and_every_process_is_killed(tmp_path):
    plan = write_plan(tmp_path, [strategy(1, 2, 1, 1, 0.02)])
    out = tmp_path / "out"
    t0 = time.monotonic()
    (r,) = run_trials(plan, options(out, timeout_s=1.5, env=control(pp2dp1tp1mbs1={"mode": "hang", "rank": 1})))
    assert r.status == "timeout"
    assert "timeout" in r.reason and "last progress" in r.reason
    # the timeout is enforced: the trial ends after it, and not much later (SIGTERM grace + a busy machine's slack)
    assert 1.5 <= r.wall_s < 1.5 + 2.0 + 10.0
    assert time.monotonic() - t0 < 30
    assert processes_mentioning(r.job_dir) == []
    assert _jsonl(out)[0]["status"] == "timeout"


def test_a_dead_builders_lock_is_cleared_before_a_trial_and_after_a_timeout(tmp_path, monkeypatch, capsys):
    # A rank killed while it held torch's build lock of DeepSpeed's op (here: the fake worker takes it as torch does,
    # then hangs, and the runner kills it at the timeout) leaves the lock, and every later start would wait on it.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # a private ampe folder, never the machine's
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    ext = jitops.extensions_dir()
    plan = write_plan(tmp_path, [strategy(1, 2, 1, 1, 0.02), strategy(2, 1, 2, 1, 0.05)])
    hang = control(pp2dp1tp1mbs1={"mode": "hang", "rank": 1, "baton": True})
    stuck, ok = run_trials(plan, options(tmp_path / "out", timeout_s=1.5, env=hang, quiet_s=0.3))
    lock = ext.op_dir / "lock"
    assert stuck.status == "timeout" and "cleared" in stuck.reason and str(lock) in stuck.reason
    assert ok.status == "ok" and not lock.exists()  # the next trial started normally
    assert json.loads((Path(ok.job_dir) / "command.json").read_text())["env"]["TORCH_EXTENSIONS_DIR"] == \
        str(ext.path)
    err = capsys.readouterr().err
    assert err.count(jitops.stale_message(lock)) == 1

    # One left before the run (an older run killed mid-build) is cleared before the first trial starts.
    lock.touch()
    (r,) = run_trials(plan, options(tmp_path / "again", top_k=1))
    assert r.status == "ok" and not lock.exists()
    assert capsys.readouterr().err.count(jitops.stale_message(lock)) == 1


def test_killed_rank_is_recorded_with_its_rank(tmp_path):
    plan = write_plan(tmp_path, [strategy(1, 2, 1, 1, 0.02), strategy(2, 1, 2, 1, 0.05)])
    out = tmp_path / "out"
    results = run_trials(plan, options(out, env=control(pp2dp1tp1mbs1={"mode": "kill", "rank": 1})))
    killed, ok = results
    assert killed.status == "killed" and killed.failed_rank == 1
    assert "SIGKILL" in killed.reason
    assert ok.status == "ok"  # the run goes on after a failure
    assert processes_mentioning(killed.job_dir) == []


def test_killed_rank_under_torchrun_is_attributed_from_its_report(tmp_path):
    plan = write_plan(tmp_path, [strategy(1, 2, 1, 1, 0.02)])
    out = tmp_path / "out"
    (r,) = run_trials(plan, options(out, launcher="torchrun", timeout_s=60,
                                    env=control(pp2dp1tp1mbs1={"mode": "kill", "rank": 1})))
    assert r.status == "killed", r.reason
    assert r.failed_rank == 1 and "SIGKILL" in r.reason
    cmd = json.loads((Path(r.job_dir) / "command.json").read_text())["argv"]
    assert cmd[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    assert processes_mentioning(r.job_dir) == []


def test_crash_and_silent_exit_are_crashes_with_reasons(tmp_path):
    plan = write_plan(tmp_path, [strategy(1, 2, 1, 1, 0.02), strategy(2, 2, 1, 2, 0.03),
                                 strategy(3, 1, 2, 1, 0.05)])
    env = control(pp2dp1tp1mbs1={"mode": "crash", "rank": 0}, pp2dp1tp1mbs2={"mode": "exit", "rank": 1},
                  pp1dp2tp1mbs1={"mode": "badresult"})
    crash, silent, bad = run_trials(plan, options(tmp_path / "out", env=env))
    assert crash.status == "crash" and crash.failed_rank == 0 and "crashed on purpose" in crash.reason
    assert silent.status == "crash" and "exit status 3" in silent.reason
    assert bad.status == "crash" and "without iteration times" in bad.reason


def test_retry_failed_reruns_only_failures(tmp_path):
    plan = write_plan(tmp_path, four_strategies())
    out = tmp_path / "out"
    first = run_trials(plan, options(out, env=control(pp1dp2tp1mbs1={"mode": "crash"})))
    assert [r.status for r in first] == ["ok", "ok", "crash", "ok"]
    second = run_trials(plan, options(out, retry_failed=True))  # the fault is gone now
    assert [r.status for r in second] == ["ok"] * 4
    assert [r.started_at for r in second][:2] == [r.started_at for r in first][:2]
    lines = _jsonl(out)
    assert [l["status"] for l in lines] == ["ok", "ok", "crash", "ok", "ok"]
    assert {r.key: r.status for r in ResultsStore(out).latest().values()}[first[2].key] == "ok"


def test_budget_skips_trials_expected_to_overrun(tmp_path):
    plan = write_plan(tmp_path, [strategy(1, 2, 1, 1, 0.01), strategy(2, 2, 1, 2, 30.0),
                                 strategy(3, 1, 2, 1, 0.01)])
    out = tmp_path / "out"
    results = run_trials(plan, options(out, budget_s=20.0, startup_s=1.0))
    assert [r.status for r in results] == ["ok", "skipped", "ok"]
    assert results[1].reason.startswith("budget: expected")
    assert [l["status"] for l in _jsonl(out)] == ["ok", "ok"]  # skipped trials are not finished work
    summary = json.loads((out / "summary.json").read_text())
    assert [s["plan_rank"] for s in summary["skipped"]] == [2]
    # With a larger budget, a rerun runs the skipped trial only.
    rerun = run_trials(plan, options(out, top_k=2))
    assert [r.status for r in rerun] == ["ok", "ok"]
    assert rerun[0].started_at == results[0].started_at


def test_predicted_unfit_strategies_are_left_out_unless_asked(tmp_path):
    plan = write_plan(tmp_path, [strategy(1, 2, 1, 1, 0.02, fits=False), strategy(2, 2, 1, 2, 0.03)])
    results = run_trials(plan, options(tmp_path / "a", top_k=1))
    assert [(r.plan_rank, r.status) for r in results] == [(1, "skipped"), (2, "ok")]
    assert results[0].reason.startswith("predicted not to fit")
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["skipped"][0]["reason"].startswith("predicted not to fit")
    both = run_trials(plan, options(tmp_path / "b", run_unfit=True))
    assert [r.plan_rank for r in both] == [1, 2]


def test_emulate_backend_runs_the_schedule_with_and_without_it(tmp_path):
    steps = [["forward", m, 2000] for m in range(8)] + [["backward", m, 3000] for m in range(8)]  # gas 8
    fplan = {"stages": [steps] * 2, "time_s": 0.024, "energy_j": 1.0}
    first = strategy(1, 2, 1, 1, 0.02, frequency_plan=fplan)
    first["predicted"].update(energy_j=1.0, energy_max_clock_j=1.25)
    plan = write_plan(tmp_path, [first, strategy(2, 2, 1, 2, 0.03)])
    out = tmp_path / "out"
    results = run_trials(plan, options(out, env=control(pp2dp1tp1mbs1={"stretch": 1.5, "iter_s": 0.02})))
    assert [(r.plan_rank, r.freq_backend, r.schedule_applied) for r in results] == [
        (1, "none", False), (1, "emulate", True), (2, "none", False)]
    base, sched = results[0], results[1]
    assert sched.baseline_key == base.key and sched.predicted_iteration_s == 0.024
    # the fake sleeps 1.5× as long with the schedule and reports the stretch; how much slower the mean is depends on
    # the machine's load, so only the direction is asserted (and the reported stretch exactly)
    assert sched.iteration_s_mean > base.iteration_s_mean
    assert sched.worker["emulated_per_rank"] == [{"stretch_s": pytest.approx(0.01)}] * 2
    job = json.loads((Path(sched.job_dir) / "job.json").read_text())
    assert job["freq_backend"] == "emulate" and job["frequency_plan"]["gpu_types"] == ["cpu", "cpu"]
    assert json.loads((Path(base.job_dir) / "job.json").read_text())["frequency_plan"] is None
    assert (base.predicted_energy_j, sched.predicted_energy_j) == (1.25, 1.0)
    (row,) = build_report(out).schedules
    assert row.predicted_energy_saving_pct == pytest.approx(20.0)
    assert row.energy_saving_pct == pytest.approx(20.0)  # the fake models 0.8× energy with a schedule
    assert row.measured_slowdown > 1.0 and row.predicted_slowdown == pytest.approx(1.2)


def test_truncated_last_line_is_ignored_and_cut_on_next_append(tmp_path):
    plan = write_plan(tmp_path, four_strategies())
    out = tmp_path / "out"
    run_trials(plan, options(out, top_k=2))
    with open(out / "results.jsonl", "a") as f:
        f.write('{"schema": "ampe.trial/1", "key": "abc", "sta')  # a write cut by a crash
    store = ResultsStore(out)
    assert len(store.load()) == 2
    results = run_trials(plan, options(out))
    assert [r.status for r in results] == ["ok"] * 4
    assert len(_jsonl(out)) == 4  # the fragment is gone, every line parses


def test_sigint_stops_cleanly_keeps_results_and_resume_finishes(tmp_path):
    plan = write_plan(tmp_path, four_strategies())
    out = tmp_path / "out"
    env = {**os.environ, **control(pp2dp1tp1mbs2={"iter_s": 0.5})}
    argv = [sys.executable, "-m", "ampe", "trial", "--plan", str(plan), "--out", str(out), "--worker", FAKE_WORKER,
            "--launcher", "local", "--warmup", "1", "--iters", "20", "--timeout", "60", "--no-prebuild"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        progress = None
        while time.monotonic() < deadline:  # wait until trial 2 is running and has reported an iteration
            found = list((out / "trials").glob("r002-*/progress.json")) if (out / "trials").exists() else []
            if found:
                progress = found[0]
                break
            time.sleep(0.05)
        assert progress is not None, "trial 2 never started"
        proc.send_signal(signal.SIGINT)
        _stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "trial 1/4" in stderr  # the plain progress lines (stderr is not a terminal)
    lines = _jsonl(out)
    assert [(l["plan_rank"], l["status"]) for l in lines] == [(1, "ok"), (2, "interrupted")]
    assert processes_mentioning(str(progress.parent)) == []
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"] == {"ok": 1, "interrupted": 1}

    results = run_trials(plan, options(out, timed_iters=20))  # resume
    assert [r.status for r in results] == ["ok"] * 4
    assert results[0].started_at == lines[0]["started_at"]  # trial 1 was not rerun
    assert [(l["plan_rank"], l["status"]) for l in _jsonl(out)] == [
        (1, "ok"), (2, "interrupted"), (2, "ok"), (3, "ok"), (4, "ok")]


@pytest.mark.parametrize("field,value,message", [
    ("schema", "ampe.plan/0", "schema"),
    ("global_batch", 0, "global_batch"),
])
def test_bad_plan_is_one_line_exit_2(tmp_path, run_cli, field, value, message):
    path = write_plan(tmp_path, four_strategies())
    raw = json.loads(path.read_text())
    raw[field] = value
    path.write_text(json.dumps(raw))
    code, _out, err = run_cli("trial", "--plan", path, "--out", tmp_path / "out")
    assert code == 2
    assert err.count("\n") == 1 and str(path) in err and message in err


@pytest.mark.parametrize("first,second", [(signal.SIGTERM, signal.SIGINT), (signal.SIGINT, signal.SIGINT),
                                          (signal.SIGINT, signal.SIGTERM)])
@pytest.mark.parametrize("gap_s", [0.0, 0.03, 0.25])
def test_back_to_back_signals_lose_nothing_and_leave_no_process(tmp_path, first, second, gap_s):
    """Two signals in a row, the second at a random-ish point of the stop (right away, while the trial is being
    killed, after): the running trial is recorded as interrupted, the results file stays valid, every process of
    the trial is gone, and the runner exits 130 without a traceback."""
    plan = write_plan(tmp_path, four_strategies()[:2])
    out = tmp_path / "out"
    env = {**os.environ, **control(pp2dp1tp1mbs1={"iter_s": 0.3})}
    argv = [sys.executable, "-m", "ampe", "trial", "--plan", str(plan), "--out", str(out), "--worker", FAKE_WORKER,
            "--launcher", "local", "--warmup", "1", "--iters", "50", "--timeout", "60", "--no-prebuild"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    job_dir = None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and job_dir is None:  # trial 1 is running
            found = list((out / "trials").glob("r001-*/progress.json")) if (out / "trials").exists() else []
            job_dir = found[0].parent if found else None
            time.sleep(0.02)
        assert job_dir is not None, "trial 1 never started"
        proc.send_signal(first)
        time.sleep(gap_s)
        if proc.poll() is None:
            proc.send_signal(second)
        _stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    lines = _jsonl(out)  # every line parses: nothing half-written
    assert [(line["plan_rank"], line["status"]) for line in lines] == [(1, "interrupted")]
    assert processes_mentioning(str(job_dir)) == []
    assert json.loads((out / "summary.json").read_text())["counts"] == {"interrupted": 1}
