"""``benchmarks/gpu_check.sh``, the one call a lent GPU gets (docs/gpu_check.md):

* its dry run — the same steps, files and columns on this CPU with a tiny Llama — works end to end: guard, the GPU
  time estimate printed before anything runs, profiles of both kernels (flash with the CPU's modelled energy, eager
  without) merged by ampe into one file the search accepts, trials of both attention kernels with and without
  recomputation, report, export and a user script; a second call with the same --out reuses what it stored;
* every record it stored (``tests/data/<gpu>/gpu_check/``: a GPU's, and the CPU dry run's kept beside them) still
  holds: the cost model's predictions, made now from the stored profile, are no worse against the stored
  measurements than when the record was made.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ampe.measure.freq import MODELLED_METER
from benchmarks.support.gpu_check_summary import figures, rows

ROOT = Path(__file__).resolve().parents[2]
RECORDS = sorted(p for p in (ROOT / "tests" / "data").glob("*/gpu_check") if (p / "summary.json").exists())
PLANS = {"flash_none", "flash_full", "eager_none", "eager_full"}


def _dry_run(out: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run", "--out", str(out),
                           "--python", sys.executable], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=3000)  # a bound on a busy shared machine, not a speed check


def _has_expandable_segments() -> bool:
    """Whether this ampe's search plans expandable segments (the footprint work): the dry run then adds the
    flash/none plan with them on."""
    proc = subprocess.run([sys.executable, "-m", "ampe", "search", "--help"], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return "--expandable-segments" in proc.stdout


@pytest.mark.trial
def test_the_dry_run_goes_through_every_step_and_a_second_call_continues(tmp_path):
    proc = _dry_run(tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    err = proc.stderr
    assert "guard in force" in err
    # the GPU estimate, per step, before anything runs
    assert err.index("GPU time estimate, at the pace measured on one H200") < err.index("profiled seq 128 eager")
    total = re.search(r"\n  total +(\d+) s  of a 420 s budget", err)
    assert total and int(total.group(1)) <= 420, err[:3000]
    for step in ("profile eager", "profile flash", "merge profiles", "trials eager_full", "export, user script"):
        assert re.search(rf"\n  {step}.* +\d+ s  (measured|estimated)", err), step
    # one merged profile: flash rows with the CPU's modelled energy (labelled so), eager rows without
    data = tmp_path / "data"
    merged = list(csv.DictReader((data / "profile_s128.csv").open()))
    kinds = {(r["attention"], r["forward_j"] != "", r["energy_source"]) for r in merged}
    assert kinds == {("flash", True, MODELLED_METER), ("eager", False, "")}
    assert {r["layer"] for r in merged if r["same_as_layer"]} == {"2"}  # the second block repeats the first's rows
    es = _has_expandable_segments()
    plans = PLANS | ({"flash_none_es_on"} if es else set())
    for name in plans:  # the search accepted it, and read each kernel's own rows
        kernel = name.split("_")[0]
        other = "eager" if kernel == "flash" else "flash"
        first = (tmp_path / "work" / f"search_{name}.txt").read_text().splitlines()[0]
        assert f"{kernel} attention, recompute none/full measured" in first, first
        assert first.endswith(f"({other} attention rows left out)"), first
    if not es:
        assert "expandable segments on/off left out" in err
    table = rows(data)
    assert {r.plan for r in table} == plans
    assert {(r.attention, r.recompute) for r in table} == {(a, r) for a in ("eager", "flash") for r in ("none", "full")}
    assert all(r.status == "ok" for r in table) and len(table) == len(plans)
    for r in table:  # what the plan asked for is what the record says ran ("" where the record has no setting)
        assert r.expandable_segments == "on" if r.plan.endswith("_es_on") else r.expandable_segments in {"off", ""}
    for r in table:  # the kernel the plan named is the kernel that ran
        assert r.kernels == ("sdpa-flash" if r.attention == "flash" else "eager")
        assert r.memory_err_pct is not None and abs(r.memory_err_pct) <= 10, r
    figs = json.loads((data / "summary.json").read_text())["figures"]
    assert figs == json.loads(json.dumps(figures(data, table)))  # recorded as computed
    assert figs["optimizers"] == ["torch.optim.AdamW(fused)"]  # trials and the user's script: one optimizer
    assert figs["user_attention_kernel"] == "sdpa-flash"
    user = [json.loads(x) for x in (data / "user_measurements.jsonl").read_text().splitlines()]
    assert [u["status"] for u in user] == ["ok"] and user[0]["strategy"]["attention"] == "flash"
    assert json.loads((data / "export_ds_config.json").read_text())["optimizer"]["params"]["torch_adam"] is True

    stored = {p.name: p.read_text() for p in data.glob("trials_*.jsonl")}
    again = _dry_run(tmp_path)  # continues: nothing is measured again
    assert again.returncode == 0, again.stderr[-4000:]
    for kernel in ("eager", "flash"):
        assert f"profile seq 128 {kernel}: reused" in again.stderr
    assert "profiled seq" not in again.stderr and "merged" not in again.stderr
    assert "exported plan rank 1: reused its run" in again.stderr
    assert "trials eager_full (0 of 1, 1 kept)" in again.stderr  # its estimate counts only what is left
    assert "profile flash" not in again.stderr.split("dry run:")[0]
    assert {p.name: p.read_text() for p in data.glob("trials_*.jsonl")} == stored  # no trial ran again


@pytest.mark.parametrize("record", RECORDS, ids=[p.parent.name for p in RECORDS])
def test_the_cost_model_holds_to_every_stored_record(record):
    recorded = json.loads((record / "summary.json").read_text())["figures"]
    now = figures(record, rows(record))
    assert now["trials"] == recorded["trials"] and now["ok"] == recorded["ok"]
    # a deliberate change to the cost model may move these; it must not make them worse unnoticed
    if recorded["time_mape_pct"] is not None:
        assert now["time_mape_pct"] <= recorded["time_mape_pct"] + 2.0
    if recorded["max_memory_err_pct"] is not None:
        assert now["max_memory_err_pct"] <= max(recorded["max_memory_err_pct"] + 2.0, 10.0)
    assert now["optimizers"] == recorded["optimizers"]


def test_there_is_a_record_to_hold():
    """The CPU dry run's record is kept, so the holding test above runs on real measurements until a GPU's exists."""
    assert any(p.parent.name == "cpu" for p in RECORDS)


def test_the_h200_record_is_held():
    assert any(p.parent.name == "h200" for p in RECORDS)


def test_the_summary_reads_every_record_shape(tmp_path):
    """The H200 record (an OOM without memory, energy on some trials only, no footprint fields) beside records with
    the whole footprint and expandable segments, as the footprint work writes them."""
    import shutil

    data = tmp_path / "gpu_check"
    shutil.copytree(ROOT / "tests" / "data" / "h200" / "gpu_check", data)
    src = json.loads((data / "trials_flash_none.jsonl").read_text().splitlines()[0])
    pair = []
    for on, reserved in ((False, 84.0), (True, 80.5)):
        r = json.loads(json.dumps(src))
        r["strategy"]["expandable_segments"] = on
        r["key"] = f"es-{on}"
        r["peak_reserved_bytes_per_rank"] = [int(reserved * (1 << 30))]
        r["peak_device_used_bytes_per_rank"] = [int((reserved + 1.6) * (1 << 30))]
        r["energy_j_per_iter"] = r["energy_source"] = None
        pair.append(json.dumps(r))
    (data / "trials_flash_none_es.jsonl").write_text("\n".join(pair) + "\n")
    table = rows(data)
    assert len(table) == 7
    oom = next(r for r in table if r.status == "oom")
    assert oom.measured_s is None and oom.measured_bytes is None and oom.reserved_bytes is None
    es = sorted((r for r in table if r.plan == "flash_none_es"), key=lambda r: r.expandable_segments)
    assert [r.expandable_segments for r in es] == ["off", "on"] and es[0].energy_j is None
    figs = figures(data, table)
    assert [(f["expandable_segments"], f["reserved"], f["device_used"]) for f in figs["footprint_gib"]] == \
        [("off", 84.0, 85.6), ("on", 80.5, 82.1)]
    from benchmarks.support.gpu_check_summary import markdown

    text = markdown(table, figs)
    assert "| flash_none_es | 4 | on | ok |" in text and "| 80.50 | 82.10 |" in text


def test_the_gpu_estimate_fits_its_budget_and_counts_only_what_is_left(tmp_path):
    from benchmarks.support.gpu_check_budget import estimate, pace

    p = pace()
    plans = ["flash_none", "flash_full", "eager_none", "eager_full", "flash_none_es_on"]
    steps = ["setup", "profile:eager", "profile:flash", "merge", *(f"{s}:{n}{k}" for n in plans
                                                                   for s, k in (("plan", ""), ("trial", ":1"))),
             "export"]
    full = estimate(steps, 1, p)
    assert sum(s.seconds for s in full) <= 420  # seven minutes at the H200's pace
    every_block = estimate(["profile:eager", "profile:flash"], 16, p)
    assert [s.seconds for s in every_block] == [85.0, 124.0]  # measuring all 16 blocks is the record itself
    # a resumed call: the finished trial of a plan is not charged again
    folder = tmp_path / "trials_flash_none"
    folder.mkdir()
    record = json.loads((ROOT / "tests/data/h200/gpu_check/trials_flash_none.jsonl").read_text().splitlines()[0])
    (folder / "results.jsonl").write_text(json.dumps(record) + "\n")
    left = estimate([f"trial:flash_none:2:{folder}"], 1, p)[0]
    assert left.seconds == pytest.approx(41.748) and "1 kept" in left.name
