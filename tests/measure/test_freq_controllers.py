"""Frequency controllers: emulate stretches by the planned ratio, NVML (fake) locks only on change and always
resets (normal exit, exception, SIGTERM), backend resolution never picks real NVML under pytest."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ampe.costmodel.catalog import CATALOG
from ampe.measure import freq

FAKE = Path(__file__).resolve().parent.parent / "support" / "fake_pynvml.py"
ROOT = Path(__file__).resolve().parents[2]


def load_fake():
    spec = importlib.util.spec_from_file_location("pynvml", FAKE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class LinearDvfs:
    """t(f)/t(f_max) = f_max/f, power ∝ f (a simple, exactly known model)."""

    f_max = 2000.0

    def time_ratio(self, mhz):
        return self.f_max / mhz

    def power_w(self, mhz):
        return 10.0 * mhz / self.f_max

    def blocking_power_w(self):
        return 2.0


class FakeTime:
    """A clock that only moves when the code sleeps, spins (1 µs per read) or the test advances it."""

    def __init__(self):
        self.now = 0.0
        self.slept = []

    def clock(self):
        self.now += 1e-6
        return self.now

    def sleep(self, s):
        self.slept.append(s)
        self.now += s


def test_emulate_stretches_by_the_time_ratio_exactly_with_a_fake_clock():
    t = FakeTime()
    ctl = freq.EmulateController(LinearDvfs(), clock=t.clock, sleep=t.sleep)
    for mhz, work in ((1000.0, 0.010), (2000.0, 0.020), (500.0, 0.004)):
        ctl.set_mhz(mhz)
        start = t.now
        with ctl.computation():
            t.now += work  # the "real" computation
        elapsed = t.now - start
        assert elapsed == pytest.approx(work * 2000.0 / mhz, rel=1e-3, abs=1e-5)
        assert ctl.last_duration_s == pytest.approx(work, abs=1e-5)
    assert ctl.target_stretch_s == pytest.approx(0.010 + 0.0 + 0.012, abs=1e-4)
    assert ctl.stretch_s == pytest.approx(ctl.target_stretch_s, abs=1e-4)
    assert ctl.computations == 3


def _spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_emulate_stretches_real_computations_by_the_planned_ratio():
    """Real clock: a 1.6× ratio (the project's DVFS model for the cpu type at 1500 MHz) stretches a 20 ms busy loop
    to at least 32 ms; the measured stretch is what it reports. Structure only: a busy machine may oversleep (how
    close the stretch lands is measured in benchmarks/emulated_schedule.py), never undersleep over the run: an
    oversleep is taken off the next stretch, so each computation after the first is stretched at least by the
    ratio less what the ones before overslept."""
    from ampe.energy import dvfs

    gpu = CATALOG["cpu"]
    ratio = dvfs.time_ratio(gpu, 1500)
    assert ratio > 1.2
    ctl = freq.EmulateController(freq.gpu_dvfs(gpu))
    ctl.set_mhz(1500)
    walls, reals = [], []
    for _ in range(3):
        late = ctl.stretch_s - ctl.target_stretch_s  # overslept so far
        t0 = time.perf_counter()
        with ctl.computation():
            _spin(0.02)
        walls.append(time.perf_counter() - t0)
        reals.append(ctl.last_duration_s)
        assert walls[-1] >= ratio * reals[-1] * (1 - 1e-3) - late
    assert sum(walls) >= ratio * sum(reals) * (1 - 1e-3)
    assert ctl.stretch_s >= ctl.target_stretch_s * (1 - 1e-3) > 0
    ctl.set_mhz(gpu.sm_clock_max_mhz)  # f_max: no stretch
    before = (ctl.stretch_s, ctl.target_stretch_s)
    with ctl.computation():
        _spin(0.01)
    assert (ctl.stretch_s, ctl.target_stretch_s) == before


def test_emulate_rejects_ratios_below_one():
    class Faster(LinearDvfs):
        def time_ratio(self, mhz):
            return 0.5

    with pytest.raises(ValueError, match="≥ 1"):
        freq.EmulateController(Faster()).set_mhz(3000)


def test_modelled_energy_is_busy_power_times_time_plus_blocking_power_for_the_rest():
    e = freq.ModelledEnergy(LinearDvfs())
    e.add_busy(1000.0, 0.5)  # 5 W × 0.5 s
    e.add_busy(2000.0, 0.25)  # 10 W × 0.25 s
    assert e.finish_iteration(1.0) == pytest.approx(2.5 + 2.5 + 2.0 * 0.25)
    assert e.finish_iteration(2.0) == pytest.approx(4.0)  # reset: idle only


def test_resolve_backend():
    assert freq.rank_backend("auto", "cpu", has_plan=False) == "none"
    assert freq.rank_backend("auto", "cpu", has_plan=True) == "emulate"
    # Under pytest auto never picks NVML, even when it would initialise.
    assert freq.rank_backend("auto", "cuda", True, nvml_ok=lambda: True) == "emulate"
    assert freq.rank_backend("emulate", "cuda", True) == "emulate"
    with pytest.raises(ValueError, match="CUDA"):
        freq.rank_backend("nvml", "cpu", True)
    with pytest.raises(ValueError, match="unknown"):
        freq.rank_backend("turbo", "cpu", True)


def test_real_nvml_is_refused_under_pytest(monkeypatch):
    real = type(sys)("pynvml")  # a module without the fake marker stands for the real one
    monkeypatch.setitem(sys.modules, "pynvml", real)
    with pytest.raises(RuntimeError, match="refusing"):
        freq.import_nvml()
    assert freq.try_init_nvml() is None
    monkeypatch.setitem(sys.modules, "pynvml", load_fake())
    assert freq.import_nvml().AMPE_FAKE_NVML


@pytest.mark.parametrize("asynchronous", [False, True])
def test_nvml_locks_only_on_change_and_resets_on_exit(asynchronous):
    nvml = load_fake()
    with freq.NvmlController("gpu0", nvml, asynchronous=asynchronous, handle_signals=False) as ctl:
        for mhz in (1410, 1410, 1200, 1200, 1200, 1410):
            ctl.set_mhz(mhz)
        ctl.flush()
        assert [c for c in nvml.CALLS if c[0] == "lock"] == [("lock", "gpu0", 1410, 1410),
                                                               ("lock", "gpu0", 1200, 1200),
                                                               ("lock", "gpu0", 1410, 1410)]
        assert ("reset", "gpu0") not in nvml.CALLS
    assert nvml.CALLS[-1] == ("reset", "gpu0")
    ctl.close()  # idempotent
    assert nvml.CALLS.count(("reset", "gpu0")) == 1
    ctl.set_mhz(900)  # closed: ignored
    assert ("lock", "gpu0", 900, 900) not in nvml.CALLS


def test_nvml_resets_when_training_raises():
    nvml = load_fake()
    with pytest.raises(ZeroDivisionError), \
            freq.NvmlController("gpu1", nvml, asynchronous=False, handle_signals=False) as ctl:
        ctl.set_mhz(1000)
        raise ZeroDivisionError("training failed")
    assert nvml.CALLS[-1] == ("reset", "gpu1")
    assert ("lock", "gpu1", 1000, 1000) in nvml.CALLS


def test_nvml_errors_are_recorded_not_raised():
    nvml = load_fake()

    def broken(*a):
        raise nvml.NVMLError("Insufficient Permissions")

    nvml.nvmlDeviceSetGpuLockedClocks = broken
    ctl = freq.NvmlController("gpu0", nvml, asynchronous=False, handle_signals=False)
    ctl.set_mhz(1000)
    ctl.close()
    assert "Insufficient Permissions" in ctl.stats()["errors"][0]


def test_nvml_energy_meter_reads_joules():
    nvml = load_fake()
    meter = freq.NvmlEnergyMeter("gpu0", nvml)
    a = meter.read_j()
    assert meter.read_j() - a == pytest.approx(1.5)


_SIGNAL_CHILD = textwrap.dedent("""
    import importlib.util, signal, sys, time
    # Python's own SIGINT handler, as in a foreground process: a shell starting jobs in the background (CI under
    # nohup, `cmd &`) hands its children SIGINT ignored, and then "the previous behaviour" is to ignore it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    spec = importlib.util.spec_from_file_location("pynvml", sys.argv[1])
    nvml = importlib.util.module_from_spec(spec); spec.loader.exec_module(nvml)
    sys.modules["pynvml"] = nvml
    from ampe.measure.freq import NvmlController
    ctl = NvmlController("gpu0", nvml, asynchronous=True)
    ctl.set_mhz(1200)
    ctl.flush()
    print("ready", flush=True)
    time.sleep(60)
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_nvml_resets_on_signal_and_dies_of_it(tmp_path, sig):
    log = tmp_path / "nvml.log"
    env = {**os.environ, "AMPE_FAKE_NVML_LOG": str(log), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _SIGNAL_CHILD, str(FAKE)], stdout=subprocess.PIPE, env=env,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(sig)
        rc = proc.wait(timeout=120)  # generous: CI machines are busy
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = log.read_text().splitlines()
    assert lines[:2] == ["lock gpu0 1200 1200", "reset gpu0"]
    if sig == signal.SIGTERM:
        assert rc == -signal.SIGTERM  # the runner still sees "killed by a signal"
    else:
        assert rc != 0  # SIGINT → KeyboardInterrupt (Python's default handler) after the reset
