"""``benchmarks/gpu_check.sh``, the one call a lent GPU gets (docs/gpu_check.md):

* its dry run — the same steps on this CPU with a tiny Llama — works end to end: guard, profile, search, trials of
  both attention kernels with and without recomputation, report, export and a user script;
* every record it stored (``tests/data/<gpu>/gpu_check/``: a GPU's, and the CPU dry run's kept beside them) still
  holds: the cost model's predictions, made now from the stored profile, are no worse against the stored
  measurements than when the record was made.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.support.gpu_check_summary import figures, rows

ROOT = Path(__file__).resolve().parents[2]
RECORDS = sorted(p for p in (ROOT / "tests" / "data").glob("*/gpu_check") if (p / "summary.json").exists())


@pytest.mark.trial
def test_the_dry_run_goes_through_every_step(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run", "--out", str(tmp_path),
                           "--top-k", "2", "--python", sys.executable], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "guard in force" in proc.stderr
    data = tmp_path / "data"
    table = rows(data)
    assert {(r.attention, r.recompute) for r in table} == {(a, r) for a in ("eager", "flash") for r in ("none", "full")}
    assert all(r.status == "ok" for r in table) and len(table) == 5  # flash/none: its top 2 (the mbs trend)
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
