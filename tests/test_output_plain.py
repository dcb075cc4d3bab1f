"""What ampe's own commands print: tables that never cut a word when piped, counts whose nouns agree, the demo's
profile line in a readable length, the trial worker's one-line result, and no DeepSpeed warning from a CPU profile."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

from ampe.cli._common import print_table
from ampe.costmodel.profile import load_profile
from ampe.costmodel.zoo import load_model
from ampe.formats.worker import WorkerResult
from tests.conftest import AMP_PROFILE, ROOT

LABELS = ["pp2·dp1·tp1·mbs4·eager", "pp8·dp2·tp1·mbs1·eager·ZeRO-1", "pp1·dp4·tp1·mbs2·flash·recompute-full"]


def test_a_piped_table_keeps_every_cell_whole(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()  # no terminal: as a pipe
    reason = "not runnable by ampe's worker: the trial worker builds Llama-family models at tp = 1 only " * 2
    print_table("ampe trial: 3 trials (results in runs/x)", ["rank", "strategy", "status", "reason"],
                [[i + 1, label, "skipped", reason.strip()] for i, label in enumerate(LABELS)], file=out)
    text = out.getvalue()
    for label in LABELS:
        assert label in text, text
    assert reason.strip() in text
    assert len(text.splitlines()) == 1 + 4 + 3  # title, 3 rules, header, 3 rows: none wrapped


def test_report_counts_trials_and_strategies_apart(run_cli):
    data = ROOT / "tests" / "data" / "cpu_trials"
    code, out, err = run_cli("report", "--measurements", data / "measurements_ws2.jsonl", "--cluster",
                             data / "local-cpu.yaml", "--model", "gpt2-tiny", "--profile", data / "profile.csv")
    assert code == 0, err
    title = re.search(r"ampe report: .*\((\d+) trials? of (\d+) strateg(?:y|ies)\)", out)
    assert title, out[:400]
    assert re.search(rf"measured strategies: \d+ of {title.group(2)} run", out), out


def test_the_demo_profile_line_names_each_gpu_type_once():
    model = load_model("gpt2-amp")
    line, _ = load_profile(AMP_PROFILE).for_model(model).describe(model)
    assert len(line) < 300, line
    assert line.count(" on T4 (tp 1,2,4, mbs 1)") == 1 and line.count(" on V100-16GB (tp 1,2,4, mbs 1)") == 1


def test_the_workers_one_line_result(tmp_path):
    from ampe.runtime.worker import result_line

    result = WorkerResult.parse({"status": "ok", "iteration_s": [0.5, 0.52, 0.48], "iteration_s_mean": 0.5,
                                 "iteration_s_std": 0.02, "peak_memory_bytes_per_rank": [2**30, 3 * 2**29],
                                 "energy_j_per_iter": 12.5, "energy_source": "modelled"}, "result.json")
    line = result_line(result, tmp_path / "result.json")
    assert "\n" not in line
    assert line == (f"ampe worker: ok, 3 timed iterations, 0.5 ± 0.02 s/iter, peak 1.50 GiB per rank, 12.5 J/iter "
                    f"(modelled) ({tmp_path / 'result.json'})")


def test_a_cpu_profile_prints_no_deepspeed_warning(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}  # as a user's shell has it
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run([sys.executable, "-m", "ampe", "profile", "--model", "gpt2-tiny", "--device", "cpu",
                        "--recompute", "none", "--warmup", "0", "--repeats", "1", "--out", str(tmp_path / "p.csv")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "WARNING" not in r.stderr and "Setting accelerator" not in r.stderr, r.stderr
    assert "1 micro-batch size ×" in r.stderr
