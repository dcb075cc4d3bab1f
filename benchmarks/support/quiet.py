"""A quiet-machine gate for benchmarks on a shared machine: a speed probe and :class:`QuietGate`.

Benchmark-only (CPU trials timed on a shared 2-core VM); nothing in ``ampe`` imports it.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

import torch

from ampe.costmodel.zoo import load_model
from ampe.measure.host_load import LoadSample, other_cores
from ampe.runtime.gpt_pipe import build_layer


def speed_probe(cores: list[int] | None = None, seconds: float = 0.25) -> dict[int, float]:
    """A yardstick of the machine's current speed: median seconds of one forward+backward of a gpt2-tiny transformer
    block (micro-batch 1, one thread) on each of ``cores`` (default: every core this process may use), run one core
    after the other for about ``seconds`` each. The process's affinity and thread count are restored."""
    allowed = sorted(os.sched_getaffinity(0))
    threads = torch.get_num_threads()
    model = load_model("gpt2-tiny")
    torch.manual_seed(0)
    block = build_layer(model, 2).train()
    x0 = torch.randn(1, model.seq_len, model.hidden)
    out: dict[int, float] = {}
    try:
        torch.set_num_threads(1)
        for core in cores if cores is not None else allowed:
            os.sched_setaffinity(0, {core})
            times: list[float] = []
            t_end = time.perf_counter() + seconds
            while time.perf_counter() < t_end or len(times) < 5:
                x = x0.clone().requires_grad_(True)
                t0 = time.perf_counter()
                block(x).sum().backward()
                times.append(time.perf_counter() - t0)
            out[core] = statistics.median(times[2:])
    finally:
        os.sched_setaffinity(0, set(allowed))
        torch.set_num_threads(threads)
    return out


@dataclass(frozen=True)
class GateReading:
    """What :meth:`QuietGate.wait` saw last: other processes' load, the speed probe and how long it waited."""

    other_cores: float | None  # cores other processes kept busy over the last window
    probe_s: float  # slowest core's probe time, seconds
    slowdown: float  # probe_s over the fastest probe seen so far (1.0 = the machine at its best)
    waited_s: float
    quiet: bool  # False when max_wait_s ran out first


class QuietGate:
    """Waits (up to ``max_wait_s``) until the machine is quiet enough to time a CPU trial: other processes use at
    most ``max_other_cores`` cores over a ``window_s`` window, and the speed probe is within ``max_slowdown`` of the
    fastest probe seen so far (a virtual machine also slows down when its *host* is busy, which no counter inside
    shows). Meant for benchmarks on a shared machine; it never makes a result better, only measured at a better
    moment, and every reading is kept (``readings``) so the report can say how loaded the machine was."""

    def __init__(self, max_other_cores: float = 0.15, max_slowdown: float = 1.15, window_s: float = 2.0,
                 max_wait_s: float = 180.0) -> None:
        self.max_other_cores, self.max_slowdown = max_other_cores, max_slowdown
        self.window_s, self.max_wait_s = window_s, max_wait_s
        self.best_probe_s: float | None = None
        self.readings: list[GateReading] = []

    def other_cores_now(self) -> float | None:
        """Cores other processes keep busy over one window (this process's own CPU time excluded)."""
        a = LoadSample.now()
        time.sleep(self.window_s)
        b = LoadSample.now()
        return other_cores(a.machine_busy_s, b.machine_busy_s, b.own_cpu_s - a.own_cpu_s, b.wall_s - a.wall_s)

    def probe(self) -> float:
        """Run the speed probe; returns the slowest core's time and remembers the fastest seen."""
        probe_s = max(speed_probe().values())
        self.best_probe_s = probe_s if self.best_probe_s is None else min(self.best_probe_s, probe_s)
        return probe_s

    def wait(self) -> GateReading:
        """Block until the machine is quiet (or ``max_wait_s`` passes); returns the last reading."""
        t0 = time.monotonic()
        while True:
            other = self.other_cores_now()
            probe_s = self.probe()
            slowdown = probe_s / (self.best_probe_s or probe_s)
            quiet = (other is None or other <= self.max_other_cores) and slowdown <= self.max_slowdown
            waited = time.monotonic() - t0
            if quiet or waited >= self.max_wait_s:
                reading = GateReading(other, probe_s, slowdown, waited, quiet)
                self.readings.append(reading)
                return reading
