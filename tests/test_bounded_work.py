"""Issue 36, item 3: work estimated and bounded before it starts: ``search --jobs`` within the cores, a frontier's
realized points within a bound (``--resolution 0 --unit-time 1e-6``), calibration's leave-one-out on a bounded
sample of the measured strategies."""

from __future__ import annotations

import itertools

from conftest import ROOT, SPECS

from ampe.report.calibrate import MAX_SELECTION_STRATEGIES, selection_sample

PERSEUS = ROOT / "tests" / "data" / "perseus" / "stage_profile" / "gpt3-175b+a40_bf16.csv"


def test_search_jobs_beyond_the_cores_is_refused_before_any_work(run_cli):
    from ampe.cli._common import usable_cores

    code, _, err = run_cli("search", "--cluster", SPECS / "local-cpu.yaml", "--model", "gpt2-tiny", "--jobs", "100000")
    assert code == 2 and "--jobs" in err and f"at most {usable_cores()}" in err, err
    assert len(err.strip().splitlines()) == 1


def test_a_frontier_of_every_unit_step_at_a_microsecond_is_refused_with_what_to_change(run_cli, tmp_path):
    code, _, err = run_cli("frontier", "--profile", PERSEUS, "--stages", "8", "--microbatches", "12",
                           "--unit-time", "1e-6", "--resolution", "0", "--out", tmp_path / "f.json")
    assert code == 2 and "--resolution" in err and "use --resolution" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "f.json").exists()


def test_calibration_selects_on_a_bounded_even_sample():
    assert selection_sample([1.0, 3.0, 2.0]) == [0, 1, 2]
    times = [float((i * 37) % 400) for i in range(400)]
    picked = selection_sample(times)
    assert len(picked) == MAX_SELECTION_STRATEGIES == len(set(picked)) and picked == sorted(picked)
    chosen = sorted(times[i] for i in picked)
    assert chosen[0] == min(times) and chosen[-1] == max(times)
    gaps = [b - a for a, b in itertools.pairwise(chosen)]
    assert max(gaps) <= 2 * (max(times) - min(times)) / (MAX_SELECTION_STRATEGIES - 1)  # spread evenly
