"""Per-clock profiling (`ampe profile --clocks`) against the fake NVML: clocks parsed against what the GPU supports,
rows tagged, and the clock reset on normal exit, on an exception, on a refusal and on SIGTERM. Loading per-clock
profile rows."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ampe.costmodel.profile import load_profile
from ampe.errors import InputError
from ampe.formats.profile import ProfileRow
from ampe.measure.freq import NvmlController
from ampe.profiling.clocks import ClockPermissionError, parse_clocks, profile_at_clocks, supported_clocks

FAKE = Path(__file__).resolve().parent.parent / "support" / "fake_pynvml.py"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def nvml(monkeypatch):
    spec = importlib.util.spec_from_file_location("pynvml", FAKE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    return mod


def _rows() -> list[ProfileRow]:
    return [ProfileRow(model="gpt2-tiny", device="A100-40GB", tp=1, mbs=1, layer=i, forward_s=0.001 * (i + 1),
                       backward_s=0.002, forward_j=0.1, backward_j=0.2) for i in range(3)]


def test_clocks_are_checked_against_what_the_gpu_supports(nvml):
    supported = supported_clocks(nvml, "gpu0")
    assert supported[0] == 1410 and supported == sorted(supported, reverse=True)
    assert parse_clocks("all", supported) == supported
    assert parse_clocks("1200, 1410", supported) == [1410, 1200]
    for bad in ("1201", "fast", "", "0"):
        with pytest.raises(InputError, match="--clocks"):
            parse_clocks(bad, supported)


def test_every_clock_is_locked_profiled_tagged_and_then_reset(nvml):
    ctl = NvmlController("gpu0", nvml, asynchronous=False, handle_signals=False)
    rows = profile_at_clocks([1410, 1005], ctl, _rows)
    assert [r.sm_clock_mhz for r in rows] == [1410] * 3 + [1005] * 3
    assert nvml.CALLS == [("lock", "gpu0", 1410, 1410), ("lock", "gpu0", 1005, 1005), ("reset", "gpu0")]


def test_the_clock_is_reset_when_profiling_fails(nvml):
    def boom():
        raise RuntimeError("a layer failed")

    with pytest.raises(RuntimeError, match="a layer failed"):
        profile_at_clocks([1200], NvmlController("gpu0", nvml, asynchronous=False, handle_signals=False), boom)
    assert nvml.CALLS == [("lock", "gpu0", 1200, 1200), ("reset", "gpu0")]


def test_no_permission_is_a_clear_refusal_before_anything_is_measured(nvml, monkeypatch):
    monkeypatch.setenv("AMPE_FAKE_NVML_DENY", "1")
    measured = []
    with pytest.raises(ClockPermissionError) as e:
        profile_at_clocks([1200], NvmlController("gpu0", nvml, asynchronous=False, handle_signals=False),
                          lambda: measured.append(1) or _rows())
    assert not measured and "Insufficient Permissions" in str(e.value) and str(e.value).startswith("--clocks")
    assert nvml.CALLS == [("reset", "gpu0")]


_CHILD = textwrap.dedent("""
    import importlib.util, sys, time
    spec = importlib.util.spec_from_file_location("pynvml", sys.argv[1])
    nvml = importlib.util.module_from_spec(spec); spec.loader.exec_module(nvml)
    sys.modules["pynvml"] = nvml
    from ampe.measure.freq import NvmlController
    from ampe.profiling.clocks import profile_at_clocks

    def slow():
        print("ready", flush=True)
        time.sleep(60)
        return []

    profile_at_clocks([1100, 900], NvmlController("gpu0", nvml, asynchronous=False), slow)
""")


def test_sigterm_while_profiling_resets_the_clock_and_the_process_dies_of_it(tmp_path):
    log = tmp_path / "nvml.log"
    env = {**os.environ, "AMPE_FAKE_NVML_LOG": str(log), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(FAKE)], stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert log.read_text().splitlines() == ["lock gpu0 1100 1100", "reset gpu0"]
    assert rc == -signal.SIGTERM


def test_clocks_need_cuda(run_cli, tmp_path):
    code, _, err = run_cli("profile", "--model", "gpt2-tiny", "--clocks", "all", "--out", tmp_path / "p.csv")
    assert code == 2 and "--clocks" in err and err.count("\n") == 1


def test_per_clock_rows_load_beside_the_timing_rows(tmp_path):
    f = tmp_path / "p.csv"
    lines = ["model,device,tp,mbs,layer,forward_s,backward_s,forward_j,backward_j,sm_clock_mhz"]
    for mhz, slow in ((1410, 1.0), (1005, 1.3)):
        for layer in range(2):
            lines.append(f"gpt2-tiny,A100-40GB,1,2,{layer},{0.01 * slow},{0.02 * slow},{3.0 / slow},{6.0 / slow},"
                         f"{mhz}")
    f.write_text("\n".join(lines) + "\n")
    p = load_profile(f)
    assert p.clocks("gpt2-tiny", "A100-40GB", 1) == [1410, 1005]
    assert p.layer_time("gpt2-tiny", "A100-40GB", 1, 0, 2) == (0.01, 0.02)  # timing rows: the highest clock's
    s = p.layer_at_clock("gpt2-tiny", "A100-40GB", 1, 1, 4, 1005)  # mbs 4 from mbs 2: times and joules × 2
    assert s.forward_s == pytest.approx(0.026) and s.backward_j == pytest.approx(2 * 6.0 / 1.3)
    f.write_text("\n".join([*lines, lines[-1]]) + "\n")
    with pytest.raises(InputError, match="1005 MHz"):
        load_profile(f)
