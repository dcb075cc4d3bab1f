"""Emulated mixed speeds (issue 34 item 5), without processes: the ratios from the device types, the job the runner
writes with and without ``emulate_speed``, the trial key, the controller's stretch (a fake clock), and the run-queue
wait the hook records per computation (what a shared core adds to the stretched span)."""

from __future__ import annotations

import json

import pytest
from conftest import SPECS

from ampe.costmodel.catalog import CATALOG, emulated_slowdowns
from ampe.costmodel.cluster import load_cluster
from ampe.measure import freq, host_load
from ampe.runtime.hook import FrequencyHook
from ampe.trials.launch import job_dict
from ampe.trials.prepare import TrialOptions, prepare
from tests.measure.test_freq_controllers import FakeTime, LinearDvfs
from tests.support.trial_fixtures import strategy


def test_the_slowdown_of_each_type_is_the_fastest_types_peak_over_its_own():
    mixed = load_cluster(SPECS / "local-cpu-mixed.yaml")
    half = mixed.devices[1].gpu
    assert half.name == "cpu-half" and half.is_cpu and CATALOG["cpu"].is_cpu and not CATALOG["A40"].is_cpu
    assert emulated_slowdowns([d.gpu for d in mixed.devices], "fp32") == (1.0, 2.0)
    a100, a40 = CATALOG["A100-40GB"], CATALOG["A40"]
    assert emulated_slowdowns([a100, a40, a100], "bf16") == (1.0, pytest.approx(312 / 149.7), 1.0)
    # at fp32 without TF32 the A40's SIMT cores are the faster ones: the ratio follows the precision
    assert emulated_slowdowns([a100, a40], "fp32") == (pytest.approx(37.4 / 19.5), 1.0)


def _plan(tmp_path, spec: str) -> str:
    entry = strategy(1, 1, 2, 1, 0.2, gbs=6)
    entry.update(replica_gas=[4, 2], gas=4)
    doc = {"schema": "ampe.plan/1", "cluster": "local-cpu-mixed", "model": "gpt2-tiny", "global_batch": 6,
           "inputs": {"cluster_spec": str(SPECS / spec), "model": "gpt2-tiny", "profile": None},
           "search": {"candidates": 1, "pruned_oom": 0, "seconds": 0.0}, "strategies": [entry]}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize("emulate", [False, True])
def test_the_job_carries_the_ratios_only_when_asked_and_the_key_says_so(tmp_path, emulate):
    ctx, trials, _ = prepare(_plan(tmp_path, "local-cpu-mixed.yaml"),
                             TrialOptions(out_dir=tmp_path / "runs", emulate_speed=emulate, freq_backend="none"))
    assert ctx.device == "cpu"  # a type derived from the cpu runs on cores
    (t,) = trials
    job = job_dict(ctx, t, tmp_path / "job")
    assert job["speed_ratio"] == ([1.0, 2.0] if emulate else None)
    assert job["strategy"]["replica_gas"] == [4, 2]
    _, (plain,), _ = prepare(_plan(tmp_path, "local-cpu-mixed.yaml"),
                             TrialOptions(out_dir=tmp_path / "other", freq_backend="none"))
    assert (plain.key == t.key) is not emulate  # a stretched trial is another trial


def test_a_slowdown_stretches_every_computation_and_multiplies_the_clocks_ratio():
    t = FakeTime()
    ctl = freq.EmulateController(LinearDvfs(), clock=t.clock, sleep=t.sleep, slowdown=2.0)
    for mhz, work, want in ((None, 0.010, 0.020), (1000.0, 0.010, 0.040), (None, 0.005, 0.010)):
        if mhz is None:
            ctl.reset()
        else:
            ctl.set_mhz(mhz)
        start = t.now
        with ctl.computation():
            t.now += work
        assert t.now - start == pytest.approx(want, rel=1e-3, abs=1e-5)
    assert ctl.stats()["slowdown"] == 2.0
    with pytest.raises(ValueError, match="slower device"):
        freq.EmulateController(LinearDvfs(), slowdown=0.5)


def test_a_late_wake_up_is_taken_off_the_next_stretch():
    """The first sleep wakes 3 ms late (its core held by another process): the next stretch is shorter by the
    overshoot, so the two add up to their targets — the emulated device computed twice as long, no longer."""
    t = FakeTime()

    def sleep(s):
        t.sleep(s + (0.003 if len(t.slept) == 0 else 0.0))

    ctl = freq.EmulateController(LinearDvfs(), clock=t.clock, sleep=sleep, slowdown=2.0)
    stretches = []
    for _ in range(2):
        with ctl.computation():
            t.now += 0.010
        stretches.append(ctl.last_stretch_s)
    late = 0.003 - freq.SPIN_TAIL_S  # the sleep ends 200 µs before the deadline, to spin the rest
    assert stretches == [pytest.approx(0.010 + late, abs=1e-5), pytest.approx(0.010 - late, abs=1e-5)]
    assert ctl.target_stretch_s == pytest.approx(0.020, abs=1e-5)
    assert ctl.stretch_s == pytest.approx(ctl.target_stretch_s, abs=1e-5)


def test_a_gpu_run_refuses_a_slowdown():
    from ampe.runtime.frequency import frequency_run

    with pytest.raises(ValueError, match="nvml"):
        frequency_run(None, "nvml", "cuda", CATALOG["A40"], 0, None, slowdown=2.0)


def test_the_run_queue_wait_is_the_second_schedstat_field_in_seconds(tmp_path, monkeypatch):
    first = host_load.run_queue_wait_s()
    if first is not None:  # Linux: the calling thread's own account, which only grows
        assert 0 <= first <= host_load.run_queue_wait_s()
    stat = tmp_path / "schedstat"
    stat.write_text("123456789 4500000000 17\n")  # on-CPU ns, run-queue wait ns, time slices
    monkeypatch.setattr(host_load, "SCHEDSTAT", str(stat))
    assert host_load.run_queue_wait_s() == pytest.approx(4.5)
    monkeypatch.setattr(host_load, "SCHEDSTAT", str(tmp_path / "absent"))
    assert host_load.run_queue_wait_s() is None


def test_the_stretch_covers_the_computation_with_its_run_queue_wait_and_the_hook_records_that_wait():
    """A slowdown-2 rank whose 10 ms forward spent 4 ms waiting for its core (another process ran there): the stretch
    doubles the whole 10 ms — the wait included, by decision (docs/trials.md, "Emulated mixed speeds"): under load
    shared alike by both cores it keeps the types' ratio — and the record says how much of it was waiting. The
    optimizer step is neither stretched nor recorded."""
    t = FakeTime()
    waited = {"s": 1.0}
    ctl = freq.EmulateController(LinearDvfs(), clock=t.clock, sleep=t.sleep, slowdown=2.0)
    hook = FrequencyHook(None, ctl, clock=t.clock, waited=lambda: waited["s"])

    def forward():
        t.now += 0.010
        waited["s"] += 0.004

    hook.run("forward", forward)
    hook.run_other(lambda: setattr(t, "now", t.now + 0.005))
    (rec,) = hook.end_iteration()
    assert rec.stretch_s == pytest.approx(0.010, abs=2e-5) and rec.seconds == pytest.approx(0.020, abs=3e-5)
    assert rec.waited_s == pytest.approx(0.004)
    assert t.slept == [pytest.approx(0.010 - freq.SPIN_TAIL_S, abs=1e-5)]
    unmeasured = FrequencyHook(None, freq.NoneController(), waited=lambda: None)
    unmeasured.run("forward", lambda: None)
    assert unmeasured.end_iteration()[0].waited_s is None
