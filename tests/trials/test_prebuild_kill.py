"""A real build of DeepSpeed's CPU comm op, killed midway, holds up neither the next trial nor the next export.

Real, not a stand-in: ``python -m ampe.runtime.prebuild`` compiles ``deepspeed_shm_comm`` with g++ in a private ampe
folder (``XDG_CACHE_HOME`` in tmp_path, so the machine's shared folder is never touched), and the test SIGKILLs the
builder and every process under it (ninja, the compiler) while the compiler runs — what a cancelled CI job or a
``kill -9`` does, leaving torch's build lock and half-written outputs behind. Then ``ampe trial`` must clear the lock
(one line), build the op once (one line) before any rank starts, and run the trial; the ranks must find the op built.
Afterwards a rank killed while it held the lock (a process taking torch's own ``FileBaton`` and SIGKILLed) must not
hold up the exported ``launch_worker.sh`` either. One extra build: about a minute on two cores, up to four busy.
Every wait is for an event, with a limit only against hanging; nothing is timed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ampe import jitops
from tests.support.trial_fixtures import strategy, write_plan

pytest.importorskip("deepspeed")
psutil = pytest.importorskip("psutil")
pytestmark = pytest.mark.trial

ROOT = Path(__file__).resolve().parents[2]
LIMIT_S = 900.0  # against hanging only: a cold build on a busy 2-core machine takes up to about 4 minutes


def _wait_for(what: str, check: Callable[[], object]) -> object:
    deadline = time.monotonic() + LIMIT_S
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"gave up waiting for {what}")


def _kill_tree(pid: int) -> None:
    """SIGKILL a process and everything under it (ninja starts each compiler in a process group of its own)."""
    root = psutil.Process(pid)
    victims: dict[int, psutil.Process] = {}
    for _ in range(3):  # stop the tree top-down until it stops growing: a stopped ninja starts no compiler
        for p in [root, *root.children(recursive=True)]:
            if p.pid not in victims:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.suspend()
                victims[p.pid] = p
    for p in victims.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGKILL)
    psutil.wait_procs(list(victims.values()), timeout=30)


def test_a_build_killed_midway_holds_up_neither_the_next_trial_nor_the_next_export(tmp_path, monkeypatch, run_cli):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DS_ACCELERATOR": "cpu"}
    ext = jitops.extensions_dir(env)
    baton = ext.op_dir / jitops.BATON
    building = f"ampe: building DeepSpeed's CPU comm op once (about a minute) in {ext.path}"

    # 1. A real build, killed while the compiler runs.
    builder = subprocess.Popen([sys.executable, "-m", "ampe.runtime.prebuild"], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert builder.stderr is not None
        assert builder.stderr.readline().rstrip("\n") == building  # said up front, before the compiler starts
        _wait_for("the compiler", lambda: baton.exists() and any(
            p.name() in ("cc1plus", "c++", "g++", "as") for p in psutil.Process(builder.pid).children(recursive=True)))
    finally:
        _kill_tree(builder.pid)
        builder.wait()
    assert baton.exists() and not ext.library.exists() and not jitops.is_ready(ext)
    assert jitops.holders(baton) == ()  # nothing left alive: every later start would have waited forever

    # 2. The next trial starts normally: the lock is cleared, the op built once, then the ranks start.
    plan = write_plan(tmp_path / "plan", [strategy(1, 2, 1, 1, 0.02)])
    runs = tmp_path / "runs"
    code, _, err = run_cli("trial", "--plan", plan, "--top-k", "1", "--warmup", "1", "--iters", "2", "--timeout",
                           "300", "--out", runs, "--progress", "none", "--freq-backend", "none")
    [line] = [json.loads(x) for x in (runs / "results.jsonl").read_text().splitlines()]
    log = Path(line["job_dir"], "launcher.log").read_text(errors="replace")
    assert code == 0 and line["status"] == "ok", (err, line["reason"], log[-3000:])
    said = err.splitlines()
    assert said.index(f"ampe: {jitops.stale_message(baton)}") < said.index(building)
    assert said.count(building) == 1 and "ampe: building" not in log  # the ranks found it built
    assert json.loads(Path(line["job_dir"], "command.json").read_text())["env"]["TORCH_EXTENSIONS_DIR"] == \
        str(ext.path)
    assert jitops.is_ready(ext) and not baton.exists()

    # 3. A rank killed while it held torch's lock (taken with torch's own FileBaton), then the next export's launch.
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from torch.utils.file_baton import FileBaton; "
                               "assert FileBaton(sys.argv[1]).try_acquire(); print('held', flush=True); "
                               "sys.stdin.readline()", str(baton)],
                              env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert baton.exists()
    out = tmp_path / "exp"
    code, _, err = run_cli("export", "--plan", plan, "--out", out, "--warmup", "1", "--iters", "2",
                           "--script", "train.py")  # only launch_worker.sh runs
    assert code == 0, err
    launch = subprocess.run(["/bin/sh", str(out / "launch_worker.sh")], env=env, capture_output=True, text=True,
                            timeout=LIMIT_S)
    assert launch.returncode == 0, launch.stderr[-3000:]
    assert f"ampe: {jitops.stale_message(baton)}" in launch.stderr.splitlines()
    assert "ampe: building" not in launch.stderr + launch.stdout  # built once, in step 2
    result = json.loads((out / "worker" / "result.json").read_text())
    assert result["status"] == "ok" and len(result["iteration_s"]) == 2
    # launch_worker.sh ends with the worker's one-line result
    assert [ln for ln in launch.stdout.splitlines() if ln.startswith("ampe worker: ok, 2 timed iterations, ")], \
        launch.stdout[-2000:]
