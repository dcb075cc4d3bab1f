"""The allocator as a plan property (issue 33 item 3) and the footprint a trial records (issue 32 item 2), in the
parts that need no GPU: the strategy's ``expandable_segments`` reaches the job, the ranks' environment
(``PYTORCH_CUDA_ALLOC_CONF``, the environment's other options kept), the export's launch script and the trial key;
the worker's read-back on CUDA (torch's CUDA calls stood in for) and on CPU; the runner copies the reserved and
device-used peaks into the trial record; an at-risk plan entry runs without ``--run-unfit``; the report shows it."""

from __future__ import annotations

import json

import pytest

from ampe.costmodel.strategy import Strategy, strategy_from_dict
from ampe.costmodel.training import ALLOC_CONF, allocator_conf, expandable_in_conf
from ampe.errors import InputError
from ampe.formats.plan import Caveat
from ampe.formats.worker import WorkerResult
from ampe.trials.commands import base_env
from ampe.trials.launch import build_launch, job_dict
from ampe.trials.outcome import measurements
from ampe.trials.prepare import prepare
from tests.support.trial_fixtures import four_strategies, options, write_plan


def test_the_allocator_setting_is_parsed_kept_and_refused_when_not_a_flag():
    assert allocator_conf(None, "max_split_size_mb:128") == "max_split_size_mb:128"  # not set: as it was
    assert allocator_conf(True, None) == "expandable_segments:True"
    assert allocator_conf(False, "max_split_size_mb:128,expandable_segments:True") == \
        "max_split_size_mb:128,expandable_segments:False"
    assert [expandable_in_conf(c) for c in (None, "", "max_split_size_mb:64", "expandable_segments:True",
                                            "expandable_segments:False,garbage_collection_threshold:0.6")] == \
        [None, None, None, True, False]
    s = strategy_from_dict({"pp": 1, "dp": 1, "tp": 1, "mbs": 1, "gbs": 4, "expandable_segments": True})
    assert s.expandable_segments is True and s.to_dict()["expandable_segments"] is True
    assert "expandable_segments" not in Strategy(1, 1, 1, 1, 4).to_dict()  # trial keys of older plans unchanged
    with pytest.raises(InputError, match="expandable_segments"):
        strategy_from_dict({"pp": 1, "dp": 1, "tp": 1, "mbs": 1, "gbs": 4, "expandable_segments": "yes"})


def test_the_ranks_start_with_the_plans_allocator(tmp_path, monkeypatch):
    monkeypatch.setenv(ALLOC_CONF, "max_split_size_mb:256")
    assert base_env("cuda", None, True)[ALLOC_CONF] == "max_split_size_mb:256,expandable_segments:True"
    assert ALLOC_CONF not in base_env("cuda", None, None)  # not set by the plan: the environment's own applies
    entries = four_strategies()
    entries[0]["expandable_segments"] = False
    ctx, trials, _ = prepare(write_plan(tmp_path, entries), options(tmp_path / "out"))
    job = job_dict(ctx, trials[0], tmp_path / "job")
    assert job["strategy"]["expandable_segments"] is False
    launch = build_launch(ctx, trials[0], str(tmp_path / "job" / "job.json"))
    assert launch.env[ALLOC_CONF] == "max_split_size_mb:256,expandable_segments:False"
    assert ALLOC_CONF not in build_launch(ctx, trials[1], str(tmp_path / "job" / "job.json")).env
    (tmp_path / "p").mkdir()
    _, plain, _ = prepare(write_plan(tmp_path / "p", four_strategies()), options(tmp_path / "out2"))
    assert plain[0].key != trials[0].key and plain[1].key == trials[1].key  # the allocator is part of what runs


def test_the_export_launch_script_sets_the_allocator(tmp_path):
    from ampe.trials.export import ExportOptions, export_plan

    entries = four_strategies()
    entries[0]["expandable_segments"] = True
    out = tmp_path / "export"
    export_plan(write_plan(tmp_path, entries), ExportOptions(out_dir=out))
    assert "export PYTORCH_CUDA_ALLOC_CONF=" in (out / "launch.sh").read_text()
    assert "expandable_segments:True" in (out / "launch.sh").read_text()
    assert json.loads((out / "export.json").read_text())["strategy"]["expandable_segments"] is True
    from ampe.formats.measurement import Measurement
    from ampe.runtime.user import load_export

    line = {"strategy": load_export(out / "export.json", rank=0).measurement_strategy(), "iteration_s": 1.0,
            "status": "ok"}
    assert Measurement.parse(line, "m.jsonl").strategy.expandable_segments is True  # the user's records say so


def test_the_worker_reads_back_the_footprint_on_cuda_and_says_what_it_read(monkeypatch):
    torch = pytest.importorskip("torch")
    from ampe.measure import memory_probe

    gib = 1 << 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (10 * gib, 140 * gib))  # 130 GiB used on the device
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda: 128 * gib)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda: 128 * gib - (512 << 20))
    monkeypatch.setattr(torch._C, "_accelerator_getAllocatorSettings", lambda: "expandable_segments:True",
                        raising=False)
    got = memory_probe.footprint_peaks("cuda", "expandable_segments:False")
    # the device held 2.5 GiB beyond PyTorch's reservation at the end: context and libraries, on top of the peak
    assert got["peak_reserved_bytes"] == 128 * gib
    assert got["peak_device_used_bytes"] == 128 * gib + (130 * gib - (128 * gib - (512 << 20))) == int(130.5 * gib)
    assert got["device_used_source"].startswith("cuda_mem_get_info")
    assert got["allocator_settings"] == "expandable_segments:True"  # torch's own read-back wins over the env
    cpu = memory_probe.footprint_peaks("cpu", "expandable_segments:True")
    assert cpu["peak_reserved_bytes"] is None and cpu["device_used_source"].startswith("rss_peak")
    assert cpu["peak_device_used_bytes"] > 0  # the resident high-water mark


def test_the_record_keeps_the_reserved_and_device_used_peaks(tmp_path):
    result = WorkerResult.parse({
        "status": "ok", "iteration_s": [1.0, 1.0], "peak_memory_bytes_per_rank": [100, 90],
        "memory_source": "cuda_max_allocated", "peak_reserved_bytes_per_rank": [120, 95],
        "peak_device_used_bytes_per_rank": [130, 105], "device_used_source": "cuda_mem_get_info (…)",
        "expandable_segments": True}, "result.json")
    fields, problem = measurements(tmp_path, result)
    assert problem is None
    assert fields["peak_reserved_bytes_per_rank"] == (120, 95) and fields["peak_device_used_bytes_per_rank"] == \
        (130, 105)
    assert fields["device_used_source"].startswith("cuda_mem_get_info") and fields["worker"]["expandable_segments"]


def test_an_at_risk_entry_runs_without_run_unfit_and_an_unfit_one_does_not(tmp_path):
    entries = four_strategies()
    entries[0]["predicted"]["fits"] = False
    entries[0]["caveats"] = [{"kind": "memory_at_risk", "note": "stage 0 on device 0: within the reserve"}]
    entries[1]["predicted"]["fits"] = False  # over capacity
    _, trials, left_out = prepare(write_plan(tmp_path, entries), options(tmp_path / "out"))
    assert [t.planned.rank for t in trials] == [1, 3, 4]
    assert [r.plan_rank for r in left_out] == [2] and "--run-unfit" in (left_out[0].reason or "")
    assert trials[0].planned.caveats == (Caveat(kind="memory_at_risk", note="stage 0 on device 0: within the "
                                                                         "reserve"),)
