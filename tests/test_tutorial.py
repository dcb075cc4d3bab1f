"""docs/tutorial.md stays runnable: every command of its ```bash blocks runs, in order, and what they produce is
checked for meaning (plans with strategies, real PNGs, ok trials, a calibrated profile that loads).

Conventions of the tutorial this test relies on (and enforces):

* every line of a ```bash block is exactly one ``ampe ...`` command — no pipes, ``&&``, variables, redirections,
  comments or continuation lines; each is run as ``python -m ampe <args>`` with ``shlex.split`` and no shell;
* a ```json file=PATH block is a file the reader is told to save; the test writes it (relative to the working
  folder) when the document reaches it;
* a ```yaml from=PATH block quotes a repository file; every line of it must be a line of that file;
* a bare ``` block after a command (before the next command) quotes its output: every table row of it must appear in
  what the command prints, its numbers within 1 % (the analytic figures are deterministic); a ```text example block
  is output measured on one machine (the reader is told theirs will differ): only its table's columns are checked.
  Every output block after a command is checked against that command, not only the first.

The commands run in a temporary folder holding a symlink to the repository's ``cluster_specs/``, so the
tutorial's ``tut/`` lands there. Wall time, with DeepSpeed's JIT-built op cached (``make test`` builds it first): 74 s
on a 2-core VM that started idle (load average 0-3.7), 3.0-3.6 min on the same VM while other jobs kept it busy
(load average 6-16; docs/tutorial.md "Before you start"); 1-4 minutes more on a cold machine, where the first
``ampe trial`` builds the op before its first trial. The test prints each command's time.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TUTORIAL = ROOT / "docs" / "tutorial.md"
FENCE = re.compile(r"^```[ \t]*(\S*)[ \t]*(.*?)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
SHELL_CHARS = set("|&;<>$`\\(){}*?!#~")
COMMAND_TIMEOUT_S = 900  # the trial step on a cold machine: DeepSpeed's CPU op is built first (1-4 minutes)


def tutorial_steps(text: str) -> list[tuple[str, str, str]]:
    """The document's executable pieces in order: ("run", line, "") per bash line, ("write", path, content) per
    ```json file=PATH block, ("quote", path, content) per ```yaml from=PATH block."""
    steps: list[tuple[str, str, str]] = []
    for m in FENCE.finditer(text):
        lang, info, body = m.group(1), m.group(2), m.group(3)
        if lang == "bash":
            for line in body.splitlines():
                steps.append(("run", line, ""))
        elif info.startswith("file="):
            steps.append(("write", info[len("file="):], body))
        elif info.startswith("from="):
            steps.append(("quote", info[len("from="):], body))
        elif lang in ("", "text") and steps and steps[-1][0] in ("run", "output"):
            steps.append(("output", info, body))
    return steps


NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def check_quoted_output(quoted: str, printed: str, example: bool, command: str) -> None:
    """The tutorial's quoted output against what the command printed (see the module docstring)."""
    rows = [ln for ln in quoted.splitlines() if ln.startswith("│")]
    heads = [ln for ln in quoted.splitlines() if ln.startswith("┃")]
    for head in heads:  # the columns a reader is told about exist
        for col in (c.strip() for c in head.strip("┃").split("┃") if c.strip()):
            assert col in printed, f"{command}: column {col!r} quoted but not printed"
    if example:
        return
    printed_rows = [ln for ln in printed.splitlines() if ln.startswith("│")]
    for row in rows:
        key = row.split("│")[1].strip()
        match = [p for p in printed_rows if p.split("│")[1].strip() == key]
        assert match, f"{command}: quoted row {key!r} not printed"
        want = [float(x) for x in NUMBER.findall(row)]
        got = [float(x) for x in NUMBER.findall(match[0])]
        assert len(want) == len(got) and all(math.isclose(w, g, rel_tol=0.01, abs_tol=1e-9)
                                             for w, g in zip(want, got, strict=True)), \
            f"{command}: quoted {row.strip()} but it prints {match[0].strip()}"


def check_command_line(line: str) -> list[str]:
    """The argv of one tutorial line, after checking it is a plain ``ampe`` command."""
    assert line.startswith("ampe "), f"tutorial bash line is not an `ampe ...` command: {line!r}"
    assert line == line.strip(), f"stray whitespace in tutorial line: {line!r}"
    bad = sorted(SHELL_CHARS & set(line))
    assert not bad, f"shell syntax {bad} in tutorial line (lines run without a shell): {line!r}"
    argv = shlex.split(line)
    assert argv[0] == "ampe" and len(argv) > 1, line
    return argv


def test_tutorial_lines_are_plain_ampe_commands():
    """Cheap structural check (no subprocess): also runs when the `trial` tests are deselected."""
    steps = tutorial_steps(TUTORIAL.read_text())
    lines = [s[1] for s in steps if s[0] == "run"]
    assert len(lines) >= 9, "the tutorial lost its commands"
    subcommands = {check_command_line(line)[1] for line in lines}
    assert subcommands >= {"evaluate", "profile", "search", "frontier", "replan", "trial", "report"}, subcommands
    outputs = [(info, body) for kind, info, body in steps if kind == "output"]
    assert outputs and any(info != "example" for info, _ in outputs), "the tutorial quotes no checked output"
    for kind, path, _ in steps:
        if kind == "write":
            assert not Path(path).is_absolute() and ".." not in Path(path).parts, path
        if kind == "quote":
            assert (ROOT / path).is_file(), path


def _png(path: Path, min_w: int = 300, min_h: int = 200) -> tuple[int, int]:
    from PIL import Image

    assert path.is_file() and path.stat().st_size > 1000, path
    with Image.open(path) as im:
        assert im.format == "PNG", (path, im.format)
        im.verify()
    with Image.open(path) as im:  # verify() leaves the image unusable; reopen to read pixels
        w, h = im.size
        assert min_w <= w <= 4000 and min_h <= h <= 4000, (path, im.size)
        colours = im.convert("RGB").getcolors(maxcolors=1 << 20)
        assert colours is None or len(colours) > 10, f"{path}: blank image"
    return w, h


@pytest.mark.trial
def test_tutorial_runs_end_to_end(tmp_path, run_cli):
    pytest.importorskip("deepspeed")
    pytest.importorskip("PIL")
    from ampe.costmodel.profile import load_profile
    from ampe.io import read_json
    from tests.support.plans import validate_plan

    work = tmp_path / "work"
    work.mkdir()
    (work / "cluster_specs").symlink_to(ROOT / "cluster_specs", target_is_directory=True)
    env = dict(os.environ)
    env["DS_ACCELERATOR"] = "cpu"
    # tables that measured runs make wider (e.g. a "memory options" column when a strategy uses one) must not
    # wrap its headers: the quoted columns are checked by name
    env["COLUMNS"] = "200"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    log = tmp_path / "commands.log"  # every command's output, for debugging a failure

    t0 = time.monotonic()
    ran: list[str] = []
    took: list[str] = []
    printed = ""
    for kind, what, body in tutorial_steps(TUTORIAL.read_text()):
        if kind == "output":
            check_quoted_output(body, printed, what == "example", ran[-1] if ran else "")
            continue
        if kind == "quote":
            lines = set((ROOT / what).read_text().splitlines())
            missing = [ln for ln in body.splitlines() if ln not in lines]
            assert not missing, f"docs/tutorial.md quotes {what} but these lines are not in it: {missing}"
            continue
        if kind == "write":
            dest = work / what
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(body)
            continue
        argv = check_command_line(what)
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "ampe", *argv[1:]], cwd=work, env=env, check=False,
                              capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
        with log.open("a") as f:
            f.write(f"$ {what}\n# exit {proc.returncode}, {time.monotonic() - started:.1f} s\n"
                    f"{proc.stdout}\n--- stderr\n{proc.stderr}\n")
        assert proc.returncode == 0, (f"tutorial command failed (exit {proc.returncode}): {what}\n"
                                      f"--- stderr:\n{proc.stderr[-4000:]}\n--- stdout:\n{proc.stdout[-2000:]}")
        assert (proc.stdout + proc.stderr).strip(), f"no output from: {what}"
        printed = proc.stdout
        ran.append(argv[1])
        took.append(f"{argv[1]} {time.monotonic() - started:.1f} s")
    print(f"tutorial: {len(ran)} commands in {time.monotonic() - t0:.0f} s, load average {os.getloadavg()[0]:.1f} "
          f"at the end ({', '.join(took)}; log: {log})")

    tut = work / "tut"
    layers = 10  # gpt2-tiny: embedding, noop, 4 blocks, noop, norm, logits, noop

    # Profile: every layer at tp 1 and 2, positive times.
    prof = load_profile(tut / "profile.csv")
    assert all(prof.covers("gpt2-tiny", "cpu", tp, layers) for tp in (1, 2))
    assert all(t > 0 for layer in range(layers) for t in prof.layer_time("gpt2-tiny", "cpu", 1, layer, 2))
    # a transformer block keeps activations; the no-ops keep none
    assert prof.layer_memory("gpt2-tiny", "cpu", 1, 2, 1) > 0 and prof.layer_memory("gpt2-tiny", "cpu", 1, 1, 1) == 0

    # Plans: schema-valid, sorted, from the profile; the pipeline plan carries frequency plans.
    plans = {}
    for name in ("all.json", "plan.json", "plan-calibrated.json"):
        doc = validate_plan(read_json(tut / name), name)
        strategies = doc["strategies"]
        assert strategies, f"{name}: no strategies"
        times = [s["predicted"]["iteration_s"] for s in strategies]
        assert times == sorted(times) and all(0 < t < 10 for t in times), (name, times)
        assert all(s["pp"] * s["dp"] * s["tp"] == 2 and s["gbs"] == 8 for s in strategies), name
        assert all("profile" in s["predicted"]["compute_source"] for s in strategies), name
        plans[name] = doc
    pipes = plans["plan.json"]["strategies"]
    assert all(s["pp"] == 2 for s in pipes)
    fplan = pipes[0]["frequency_plan"]
    assert fplan is not None and len(fplan["stages"]) == 2
    assert fplan["energy_j"] < fplan["energy_max_clock_j"]
    assert fplan["energy_source"].startswith("modelled")
    assert any(step[2] < 3000 for stage in fplan["stages"] for step in stage)  # some computation slowed down
    assert plans["plan-calibrated.json"]["inputs"]["profile"] == "calibrated.csv"  # relative to the plan's folder
    assert plans["plan-calibrated.json"]["inputs"]["relative_to"] == "plan"

    # Frontier: a list of points, fastest first, exactly one chosen, which carries one clock list per stage.
    frontier = json.loads((tut / "frontier.json").read_text())
    assert isinstance(frontier, list) and len(frontier) >= 2
    assert sum(p["chosen"] for p in frontier) == 1
    assert [p["time_s"] for p in frontier] == sorted(p["time_s"] for p in frontier)
    assert all(p["energy_j"] > 0 for p in frontier)
    assert [len(p["plan"]) for p in frontier if "plan" in p] == [2]

    # Pictures.
    for png in ("strategies.png", "timeline.png", "frontier.png", "report.png"):
        _png(tut / png)

    # Trials: twins (baseline + emulated schedule) measured, energy labelled modelled.
    records = [json.loads(line) for line in (tut / "trials" / "results.jsonl").read_text().splitlines()]
    ok = [r for r in records if r["status"] == "ok"]
    assert len(ok) >= 2, [(r["trial_id"], r["status"], r["reason"]) for r in records]
    for r in ok:
        assert r["iteration_s"] and all(t > 0 and math.isfinite(t) for t in r["iteration_s"])
        assert r["energy_source"].startswith("modelled")
    baselines = {r["key"] for r in ok if not r["schedule_applied"]}
    twins = [r for r in ok if r["schedule_applied"] and r["freq_backend"] == "emulate"]
    assert twins and all(r["baseline_key"] in baselines for r in twins), "no measured baseline/schedule pair"
    assert all(r["plan_applied"] for r in twins)
    _check_trial_records(ok)
    _check_report_figures(tut / "trials", ok, tmp_path / "report.json", run_cli)

    # Calibration: an ordinary profile covering the model.
    cal = load_profile(tut / "calibrated.csv")
    assert cal.covers("gpt2-tiny", "cpu", 1, layers)
    assert all(t > 0 for layer in range(layers) for t in cal.layer_time("gpt2-tiny", "cpu", 1, layer, 2))


def _check_trial_records(ok: list[dict]) -> None:
    """What every measured trial record says ran and measured: the plan's shapes at world size 2 and batch 8, one
    time per timed iteration and their mean, one traced peak per rank under the model's prediction, a loss that is a
    number, and how busy other processes kept the machine (a share of its cores)."""
    for r in ok:
        s = r["strategy"]
        world = s["pp"] * s["dp"] * s["tp"]
        assert r["schema"] == "ampe.trial/1"
        assert world == 2 and s["gas"] * s["mbs"] * s["dp"] == 8, s
        assert r["iteration_s_mean"] == pytest.approx(sum(r["iteration_s"]) / len(r["iteration_s"]))
        peaks = r["peak_memory_bytes_per_rank"]
        assert len(peaks) == world and all(isinstance(p, int) and p > 1_000_000 for p in peaks), peaks
        assert r["memory_source"] == "cpu_alloc_trace"
        assert r["predicted_iteration_s"] > 0 and r["predicted_max_memory_bytes"] > max(peaks)
        worker = r["worker"]
        assert math.isfinite(worker["loss_first"]) and math.isfinite(worker["loss_last"])
        other = worker.get("host_other_cores")
        assert other is not None and 0 <= other <= (os.cpu_count() or 1), other


def _check_report_figures(trials: Path, ok: list[dict], out: Path, run_cli) -> None:
    """``ampe report --json``'s figures are those of the trials' own records: per plan rank its baseline (the run
    without a clock schedule), Spearman of predicted against measured time over them, the best measured, and the
    measured time of the predicted best (plan rank 1) over it."""
    from scipy.stats import spearmanr

    from ampe.io import read_json

    code, out_text, err = run_cli("report", trials, "--json", out)
    assert code == 0, err
    assert "Spearman" in out_text and "MAPE" in out_text and "best measured" in out_text
    rep = read_json(out)
    assert sum(rep["counts"].values()) >= len(ok) and rep["counts"].get("ok") == len(ok), rep["counts"]
    base = sorted((r for r in ok if not r["schedule_applied"]), key=lambda r: r["plan_rank"])
    assert len({r["plan_rank"] for r in base}) == len(base) >= 2
    predicted, measured = [r["predicted_iteration_s"] for r in base], [r["iteration_s_mean"] for r in base]
    assert rep["mape_pct"] is not None and math.isfinite(rep["mape_pct"]) and rep["mape_pct"] >= 0
    assert rep["spearman"] == pytest.approx(spearmanr(predicted, measured).statistic, abs=1e-12), (predicted, measured)
    assert rep["best_measured"]["measured_s"] == min(measured)
    assert rep["best_predicted"]["plan_rank"] == base[0]["plan_rank"] == 1
    assert rep["best_ratio"] == pytest.approx(base[0]["iteration_s_mean"] / min(measured), rel=1e-12)
