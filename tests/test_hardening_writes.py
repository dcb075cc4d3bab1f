"""Issue 26, items 1, 4 and 5: writes stay in the folder asked for, standard output and signals end in one line, opens
never block on a FIFO, and no trial process outlives its runner unnoticed. One reproducer per site; each ends with
the documented exit status and at most one line on stderr, within a bounded time (generous: the machine is shared)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.export.support import ampe, two_host_plan
from tests.support.trial_fixtures import FAKE_WORKER, fake_ranks, options, strategy, write_plan

ROOT = Path(__file__).resolve().parent.parent
BOUND_S = 120.0  # any single command here; far above what it takes on a quiet machine


def tree_digest(root: Path, skip: Path | None = None) -> dict[str, str]:
    """Every entry below ``root`` (``skip`` and what is below it left out) → a digest of what it is: a link's target,
    a file's mode and content, a folder's mode. Links are never followed."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        if skip is not None and (here == skip or skip in here.parents):
            continue
        for name in [*dirnames, *filenames]:
            p = here / name
            if skip is not None and p == skip:
                continue
            st = p.lstat()
            if p.is_symlink():
                out[str(p)] = f"link {os.readlink(p)}"
            elif p.is_dir():
                out[str(p)] = f"dir {st.st_mode:o}"
            else:
                out[str(p)] = f"file {st.st_mode:o} {hashlib.sha256(p.read_bytes()).hexdigest()}"
    return out


def _one_line(err: str) -> None:
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def _cli(*argv, env=None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ampe", *map(str, argv)], capture_output=True, text=True,
                          cwd=ROOT, timeout=BOUND_S, env={**os.environ, **(env or {})}, **kw)


# -- 1. writes stay where asked ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    return two_host_plan(tmp_path_factory.mktemp("plan"))


def test_export_refuses_links_in_its_folder_and_changes_nothing(plan, tmp_path):
    """One link policy for every output file (ampe.io.link_refusal): never written through, never replaced."""
    outside = tmp_path / "outside"
    (outside / "other").mkdir(parents=True)
    victim = outside / "victim.txt"
    victim.write_text("keep me\n")
    victim.chmod(0o644)
    exp = tmp_path / "exp"
    exp.mkdir()
    for name, target in (("launch.sh", victim), ("README.md", outside / "absent" / "x.md"),
                         ("ds_config.json", Path("../outside/other"))):
        (exp / name).symlink_to(target)
        before = tree_digest(tmp_path)

        code, _, err = ampe("export", "--plan", plan, "--out", exp, "--script", "pkg.train")

        assert code == 2 and "symbolic link" in err and name in err, err
        assert tree_digest(tmp_path) == before  # checked before anything is written
        assert not (outside / "absent").exists() and victim.read_text() == "keep me\n"
        assert not victim.stat().st_mode & 0o111
        (exp / name).unlink()
    code, _, err = ampe("export", "--plan", plan, "--out", exp, "--script", "pkg.train")
    assert code == 0, err
    assert not any(p.name.endswith(".tmp") for p in exp.rglob("*"))  # no temporary file left behind


@pytest.mark.parametrize("case", ["empty", "file", "dangling", "below-dangling", "device"])
def test_export_refuses_an_out_that_is_no_folder_and_creates_nothing(plan, tmp_path, case):
    (tmp_path / "file").write_text("x")
    (tmp_path / "dang").symlink_to(tmp_path / "nowhere" / "deep")
    out = {"empty": "", "file": tmp_path / "file", "dangling": tmp_path / "dang",
           "below-dangling": tmp_path / "dang" / "sub", "device": "/dev/null"}[case]
    before = tree_digest(tmp_path)
    r = _cli("export", "--plan", plan, "--out", out, "--script", "pkg.train")
    assert r.returncode == 2, r.stderr
    _one_line(r.stderr)
    assert "--out" in r.stderr
    assert tree_digest(tmp_path) == before and not (tmp_path / "nowhere").exists()


def test_an_output_folder_refuses_what_it_must_not_replace(tmp_path):
    from ampe.errors import OutputError
    from ampe.outfolder import OutputFolder

    out = OutputFolder(tmp_path / "o")
    (tmp_path / "o" / "sub").mkdir()
    os.mkfifo(tmp_path / "o" / "fifo")
    (tmp_path / "o" / "plain").write_text("x")
    with pytest.raises(OutputError, match="is a folder"):
        out.write_text("sub", "x")
    with pytest.raises(OutputError, match="not a regular file"):
        out.write_text("fifo", "x")  # never opened: no block, no write into it
    with pytest.raises(OutputError, match="not a folder"):
        out.folder("plain")
    (tmp_path / "o" / "log").symlink_to(tmp_path / "elsewhere.log")
    with pytest.raises(OutputError, match="symbolic link"):
        out.open_append("log")
    with pytest.raises(OutputError, match="not a regular file"):
        out.open_append("fifo")  # O_NONBLOCK: refused at once, never waits for a reader
    assert not (tmp_path / "elsewhere.log").exists()
    out.close()


def test_trial_results_folder_writes_nothing_through_links(tmp_path):
    from ampe.trials.runner import run_trials

    plan = write_plan(tmp_path / "p", [strategy(1, 2, 1, 1, 0.02)])
    first = run_trials(plan, options(tmp_path / "first"))
    (trial_id,) = [r.trial_id for r in first]
    outside = tmp_path / "outside"
    (outside / trial_id).mkdir(parents=True)  # what `rmtree(out/trials/<id>)` through a link would delete
    (outside / trial_id / "precious").write_text("keep\n")
    (outside / "summary.json").write_text("not ampe's\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "trials").symlink_to(outside)
    (out / "plan.json").symlink_to(outside / "absent" / "plan.json")
    before = tree_digest(tmp_path / "outside")

    from ampe.errors import OutputError

    with pytest.raises(OutputError, match=r"plan\.json is a symbolic link"):  # a link at a file: refused
        run_trials(plan, options(out))
    (out / "plan.json").unlink()
    results = run_trials(plan, options(out))  # a link at a subfolder ampe empties: the link is replaced

    assert [r.status for r in results] == ["ok"], results
    assert tree_digest(tmp_path / "outside") == before
    assert not (out / "trials").is_symlink() and (out / "trials" / trial_id / "job.json").is_file()
    assert json.loads((out / "summary.json").read_text())["counts"] == {"ok": 1}


def test_two_outputs_of_one_command_never_name_the_same_file(plan, tmp_path):
    spec = plan.parent / "two-hosts.yaml"
    search = ["search", "--cluster", spec, "--model", ROOT / "tests" / "export" / "mlp6.yaml", "--global-batch", "8",
              "--pp", "2", "--top-k", "2"]
    (tmp_path / "y.png").write_text("")
    (tmp_path / "link.png").hardlink_to(tmp_path / "y.png")
    for argv, words in (([*search, "--out", tmp_path / "x.png", "--plot", tmp_path / "x.png"], "--plot: "),
                        ([*search, "--out", tmp_path / "y.png", "--plot", tmp_path / "link.png"], "--plot: "),
                        ([*search, "--out", "-", "--plot", "-"], "standard output is also --out's"),
                        (["report", tmp_path, "--json", tmp_path / "c.csv.calibration.json", "--calibrate",
                          tmp_path / "c.csv"], "--calibrate (its sidecar)")):
        r = _cli(*argv)
        assert r.returncode == 2, r.stderr
        _one_line(r.stderr)
        assert words in r.stderr and "each output needs a file of its own" in r.stderr
    assert not (tmp_path / "x.png").exists() and (tmp_path / "y.png").read_text() == ""


# -- 4. standard output, signals, FIFOs -----------------------------------------------------------------------------

def _commands(plan: Path, tmp: Path) -> dict[str, list]:
    """Commands whose table printers and ``--out -`` write to standard output."""
    spec = plan.parent / "two-hosts.yaml"
    search = ["search", "--cluster", spec, "--model", ROOT / "tests" / "export" / "mlp6.yaml", "--global-batch", "8",
              "--pp", "2", "--top-k", "2"]
    return {"search table": search, "search --out -": [*search, "--out", "-"],
            "evaluate": ["evaluate", "--strategy", plan, "--cluster", spec, "--model",
                         ROOT / "tests" / "export" / "mlp6.yaml"],
            "export": ["export", "--plan", plan, "--out", tmp / "exp", "--script", "pkg.train"],
            "help": ["export", "--help"]}


@pytest.mark.parametrize("which", ["search table", "search --out -", "evaluate", "export", "help"])
def test_full_or_closed_stdout_and_an_ascii_terminal(plan, tmp_path, which):
    argv = [sys.executable, "-m", "ampe", *map(str, _commands(plan, tmp_path)[which])]
    with open("/dev/full", "w") as full:  # ENOSPC: one line, exit 2
        r = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=BOUND_S)
    assert r.returncode == 2, r.stderr
    _one_line(r.stderr)
    assert "standard output: cannot write (No space left on device)" in r.stderr
    closed = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    closed.stdout.close()  # the reader went away: the conventional quiet exit, 141
    err = closed.stderr.read()
    assert closed.wait(timeout=BOUND_S) == 141 and err == "", err
    r = _cli(*_commands(plan, tmp_path)[which], env={"PYTHONIOENCODING": "ascii"})
    if which == "search --out -":  # data is never written with characters replaced: refused, one line
        assert r.returncode in (0, 2) and "Traceback" not in r.stderr, r.stderr
        if r.returncode == 2:
            _one_line(r.stderr)
    else:  # tables and messages: readable, with '?' for what ASCII lacks
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        assert r.stdout.isascii()


_READY = """
import os, signal, sys
# Python's own SIGINT handler, as in a foreground process: a parent that ignores SIGINT (pytest-xdist's workers,
# a shell's background job) hands it ignored to its children, and ampe then keeps ignoring it (ampe/interrupt.py)
signal.signal(signal.SIGINT, signal.default_int_handler)
import ampe.interrupt as i
real = i.install
def install(who):  # ampe's first statement (ampe/__main__.py): quit mode, then tell the test
    real(who)
    os.write({fd}, b"!")
    os.close({fd})
i.install = install
import ampe.__main__ as m
m.entry()
"""


def test_ctrl_c_at_any_moment_is_one_line_and_130(plan, tmp_path):
    """SIGINT at spread-out moments from ampe's first statement on: imports of the command line and the subcommand,
    the parser, the search, the writes, the exit. (Before it, Python's own start answers: see ampe/interrupt.py.)
    The child starts as ``python -m ampe`` does, and says when ampe's first statement has run."""
    argv = [*map(str, _commands(plan, tmp_path)["search table"]), "--out", tmp_path / "p.json"]
    outcomes = []
    for delay in (0.0, 0.001, 0.003, 0.006, 0.01, 0.02, 0.04, 0.07, 0.1, 0.15, 0.2, 0.3, 0.4, 0.55):
        ready, tell = os.pipe()
        p = subprocess.Popen([sys.executable, "-c", _READY.format(fd=tell), *argv], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, cwd=ROOT, pass_fds=(tell,))
        os.close(tell)
        with os.fdopen(ready, "rb") as r:
            assert r.read(1) == b"!", "the child never reached ampe's first statement"
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        err = p.stderr.read()
        code = p.wait(timeout=BOUND_S)
        assert "Traceback" not in err, (delay, err)
        if code == 130:
            assert err == "ampe search: interrupted\n", (delay, err)
        else:  # the search was done before the signal arrived
            assert (code, err) == (0, ""), (delay, code, err)
        outcomes.append(code)
    assert outcomes.count(130) >= 8, outcomes  # most moments fall inside the command (the search alone: ~0.6 s)


def test_a_path_that_becomes_a_fifo_after_the_check_never_blocks(tmp_path, monkeypatch):
    import pathlib
    import threading

    from ampe.errors import InputError
    from ampe.io import read_text

    regular = tmp_path / "regular.yaml"
    regular.write_text("a: 1\n")
    fifo = tmp_path / "spec.yaml"
    os.mkfifo(fifo)
    real_stat = pathlib.Path.stat

    def stat_before_the_swap(self, *a, **kw):  # the size check sees a regular file; the open finds the FIFO
        return real_stat(regular if self == fifo else self, *a, **kw)

    monkeypatch.setattr(pathlib.Path, "stat", stat_before_the_swap)
    outcome: list[object] = []

    def read() -> None:
        try:
            outcome.append(read_text(fifo))
        except InputError as e:
            outcome.append(e)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(BOUND_S)
    if reader.is_alive():  # blocked in open(): unblock it before failing
        with open(fifo, "w"):
            pass
    assert not reader.is_alive(), "read_text blocked on a FIFO"
    (err,) = outcome
    assert isinstance(err, InputError) and "not a regular file" in str(err), err


# -- 5. no orphans, no measurement beside leftovers -------------------------------------------------------------------

WAIT_S = 120.0  # start-up of torchrun on a busy machine, the guard's and the leftovers' SIGTERM grace


def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"still waiting after {WAIT_S:g} s: {what}"
        time.sleep(0.1)


def _trial_argv(plan: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "ampe", "trial", "--plan", str(plan), "--out", str(out), "--worker", FAKE_WORKER,
            "--warmup", "1", "--iters", "2", "--progress", "none", *extra]


def _kill_all(out: Path) -> None:
    from tests.support.trial_fixtures import processes_mentioning

    for pid in processes_mentioning(str(out)):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def _runner_killed_above_its_ranks(tmp_path: Path, watchdog: bool):
    """A runner whose two torchrun ranks run for minutes, then ``kill -9`` of everything but the ranks: runner, guard,
    torchrun (the OOM killer, ``kill -9`` of the whole group, an older ampe without the guard). Yields (plan, out,
    runner pid, rank pids); whatever is left is killed afterwards."""
    import psutil

    plan = write_plan(tmp_path, [strategy(1, 2, 1, 1, 0.02)])
    out = tmp_path / "out"
    slow = {**os.environ, "AMPE_FAKE_CONTROL": json.dumps({"iter_s": 60, "watchdog": watchdog})}
    runner = subprocess.Popen(_trial_argv(plan, out, "--launcher", "torchrun"), env=slow, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: len(fake_ranks(out)) == 2, "both ranks running")
        ranks = fake_ranks(out)
        above = [p for p in [psutil.Process(runner.pid), *psutil.Process(runner.pid).children(recursive=True)]
                 if p.pid not in ranks]
        for p in above:  # all stopped first: none of them can react to another's death (the guard would end the ranks)
            p.suspend()
        for p in above:
            p.kill()
        runner.wait()
        yield plan, out, runner.pid, ranks
    finally:
        runner.kill()
        _kill_all(out)


@pytest.mark.host_alone
def test_a_results_file_that_is_a_link_is_refused_before_any_trial(tmp_path):
    plan = write_plan(tmp_path / "p", [strategy(1, 2, 1, 1, 0.02)])
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.jsonl"
    victim.write_text("")
    (out / "results.jsonl").symlink_to(victim)
    r = _cli("trial", "--plan", plan, "--out", out, "--worker", FAKE_WORKER, "--launcher", "local", "--warmup", "1",
             "--iters", "1", "--progress", "none")
    assert r.returncode == 2, r.stderr
    _one_line(r.stderr)
    assert "results.jsonl: is a symbolic link" in r.stderr
    assert victim.read_text() == "" and not (out / "trials").exists()


@pytest.mark.host_alone
def test_a_resumed_trial_ends_the_ranks_an_earlier_run_left_and_measures_alone(tmp_path):
    """The issue's case: runner, guard and torchrun gone, both ranks run on (ranks that do not watch the runner: the
    user's own script under ampe's launch, say). The rerun says so in one line, ends them, then measures alone."""
    import psutil

    with _runner_killed_above_its_ranks(tmp_path, watchdog=False) as (plan, out, _, ranks):
        time.sleep(1.0)
        assert [p for p in ranks if psutil.Process(p).status() != psutil.STATUS_ZOMBIE] == ranks  # the leftovers
        quick = {"AMPE_FAKE_CONTROL": json.dumps({"iter_s": 0.01})}
        r = subprocess.run(_trial_argv(plan, out, "--launcher", "torchrun"), capture_output=True, text=True,
                           timeout=BOUND_S + WAIT_S, env={**os.environ, **quick}, cwd=ROOT)
        assert r.returncode == 0, r.stderr
        notes = [line for line in r.stderr.splitlines() if "earlier `ampe trial`" in line]
        assert len(notes) == 1 and "2 process(es)" in notes[0] and all(str(p) in notes[0] for p in ranks), r.stderr
        assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in ranks)
        (line,) = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
        assert line["status"] == "ok"


@pytest.mark.host_alone
def test_ranks_end_themselves_when_runner_guard_and_launcher_are_all_killed(tmp_path):
    """The worker's watchdog (ampe.runnermark.watch_runner): with nothing above them left to end them, the ranks see
    the runner gone and end, each saying so in one line of the trial's log."""
    with _runner_killed_above_its_ranks(tmp_path, watchdog=True) as (_, out, runner, _):
        _wait_for(lambda: fake_ranks(out) == [], f"ranks left running: {fake_ranks(out)}")
        (log,) = (out / "trials").glob("*/launcher.log")
        said = [line for line in log.read_text().splitlines() if f"trial runner (pid {runner}) is gone" in line]
        assert len(said) == 2, log.read_text()[-2000:]


@pytest.mark.host_alone
def test_a_second_runner_on_the_same_folder_is_refused(tmp_path):
    plan = write_plan(tmp_path, [strategy(1, 2, 1, 1, 0.02)])
    out = tmp_path / "out"
    slow = {**os.environ, "AMPE_FAKE_CONTROL": json.dumps({"iter_s": 60})}
    first = subprocess.Popen(_trial_argv(plan, out, "--launcher", "local"), env=slow, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: len(fake_ranks(out)) == 2, "the first runner's ranks running")
        r = subprocess.run(_trial_argv(plan, out, "--launcher", "local"), capture_output=True, text=True,
                           timeout=BOUND_S, cwd=ROOT)
        assert r.returncode == 2, r.stderr
        _one_line(r.stderr)
        assert f"another `ampe trial` (pid {first.pid}) is running trials in this folder" in r.stderr
        assert len(fake_ranks(out)) == 2 and first.poll() is None  # the first run is untouched
    finally:
        first.send_signal(signal.SIGTERM)  # a clean stop: it ends its own trial
        try:
            first.wait(timeout=WAIT_S)
        finally:
            first.kill()
            _kill_all(out)


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_the_recorder_appends_through_no_link_and_never_blocks_on_a_fifo(plan, tmp_path, monkeypatch, kind):
    pytest.importorskip("torch")
    import threading

    from ampe.runtime import load_export

    code, _, err = ampe("export", "--plan", plan, "--out", tmp_path / "exp", "--script", "pkg.train")
    assert code == 0, err
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    rec_plan = load_export(tmp_path / "exp" / "export.json", rank=0)
    victim = tmp_path / "victim.jsonl"
    victim.write_text("")
    out = tmp_path / "exp" / "measurements.jsonl"
    if kind == "link":
        out.symlink_to(victim)
    else:
        os.mkfifo(out)
    raised: list[BaseException] = []

    def record() -> None:
        try:
            with rec_plan.recorder(path=out, warmup=0) as rec:
                rec.step(lambda: None)
        except OSError as e:
            raised.append(e)

    t = threading.Thread(target=record, daemon=True)
    t.start()
    t.join(BOUND_S)
    if t.is_alive():  # blocked on the FIFO: unblock it before failing
        with open(out, "rb"):
            pass
    assert not t.is_alive(), "the recorder blocked on a FIFO"
    (e,) = raised
    assert "cannot append measurements" in str(e)
    assert victim.read_text() == ""
