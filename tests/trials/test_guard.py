"""A trial never outlives its runner: ``kill -9`` of ``ampe trial`` takes the launcher (torchrun) and every rank with
it (ampe.trials.guard). And the worker a trial launches is checked before anything starts (ampe.trials.worker_ref)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ampe.errors import InputError
from ampe.trials.worker_ref import worker_ref
from tests.support.trial_fixtures import FAKE_WORKER, fake_ranks, processes_mentioning, strategy, write_plan

WAIT_S = 120.0  # bounded waits: start-up of torchrun on a busy machine, then the guard's SIGTERM grace


def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"still waiting after {WAIT_S:g} s: {what}"
        time.sleep(0.1)


@pytest.mark.parametrize("launcher", ["torchrun", "local"])
def test_kill_9_of_the_runner_takes_launcher_and_ranks_with_it(tmp_path, launcher):

    plan = write_plan(tmp_path, [strategy(1, 2, 1, 1, 0.02)])
    out = tmp_path / "out"
    env = {**os.environ, "AMPE_FAKE_CONTROL": json.dumps({"iter_s": 60})}  # ranks that run for minutes
    runner = subprocess.Popen([sys.executable, "-m", "ampe", "trial", "--plan", str(plan), "--out", str(out),
                               "--worker", FAKE_WORKER, "--launcher", launcher, "--warmup", "1", "--iters", "2",
                               "--progress", "none"], env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: len(fake_ranks(out)) == 2, "both ranks running")
        trial = processes_mentioning(str(out))  # runner, guard (one per rank: local), torchrun, ranks
        assert len(trial) >= 5, trial
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait()
        _wait_for(lambda: processes_mentioning(str(out)) == [], f"left behind: {processes_mentioning(str(out))}")
    finally:
        for pid in processes_mentioning(str(out)):  # only if the test failed: never leave them running
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_a_worker_is_an_existing_script_or_a_findable_module(tmp_path, monkeypatch):
    script = tmp_path / "w.py"
    script.write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    assert worker_ref("w.py") == str(script)  # made absolute: the DeepSpeed launcher starts ranks elsewhere
    assert worker_ref("ampe.runtime.worker") == "ampe.runtime.worker"
    assert worker_ref("json.tool") == "json.tool"
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("raise SystemExit('imported!')\n")
    (tmp_path / "pkg" / "run.py").write_text("")
    assert worker_ref("pkg.run") == "pkg.run"  # found in the current folder, its package never imported
    (tmp_path / "dir.py").mkdir()
    for bad, words in (("bad worker;rm", "dotted module name"), ("/nonexistent.py", "no such file"),
                       ("dir.py", "no such file"), ("ampe.runtime.nothing", "not found"), ("ampe.runtime", "__main__"),
                       ("ampe..worker", "dotted module name"), ("class.x", "dotted module name"), ("", "not a .py")):
        with pytest.raises(InputError, match=words) as e:
            worker_ref(bad)
        assert e.value.source == "--worker"


def test_checking_the_worker_imports_neither_it_nor_torch():
    code = ("import sys\nfrom ampe.trials.worker_ref import worker_ref\nworker_ref('ampe.runtime.worker')\n"
            "print(sorted(m for m in ('torch', 'ampe.runtime', 'ampe.runtime.worker') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[2])
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
