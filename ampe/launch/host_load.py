"""How busy the host's CPUs were with *other* work while a trial measured (Linux ``/proc/stat``).

CPU trials on a shared machine are slowed by whatever else runs there, and nothing in the trial's own figures shows
it. The worker therefore reads the machine-wide busy CPU time (``/proc/stat``: user + nice + system + irq + softirq
+ steal, in USER_HZ ticks) around its timed iterations, every rank reads its own process CPU time
(``time.process_time``: all its threads), and ``other_cores = (machine busy − Σ ranks' own) / wall`` is the number
of cores other processes kept busy on average (``host_other_cores`` in ``result.json``; ~0 on a quiet machine). On
GPUs the figure still says whether the host CPUs were contended (data loading, other jobs); it is not a GPU
measurement. Resolution: one tick is 10 ms per core, so over a window of a second the figure is good to ~0.02 cores.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal (idle and iowait are not busy)


def machine_busy_s() -> float | None:
    """Seconds of CPU time every core of the machine has spent busy since boot, or None where unavailable."""
    try:
        with open("/proc/stat") as f:
            first = f.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    vals = [int(x) for x in first[1:]]
    return sum(vals[i] for i in _BUSY_FIELDS if i < len(vals)) / ticks


@dataclass(frozen=True)
class Sample:
    """One reading: wall clock, machine-wide busy CPU seconds (None off Linux), this process's CPU seconds."""

    wall_s: float
    machine_busy_s: float | None
    own_cpu_s: float

    @classmethod
    def now(cls) -> "Sample":
        """Read the clocks."""
        return cls(time.perf_counter(), machine_busy_s(), time.process_time())


def other_cores(start_busy_s: float | None, end_busy_s: float | None, own_cpu_s: float, wall_s: float) -> float | None:
    """Average number of cores other processes kept busy over ``wall_s`` seconds (≥ 0), given the machine's busy
    seconds at the start and end of the window and the CPU seconds the trial's own processes used in it."""
    if start_busy_s is None or end_busy_s is None or wall_s <= 0:
        return None
    return max(0.0, (end_busy_s - start_busy_s - own_cpu_s) / wall_s)


def speed_probe(cores: list[int] | None = None, seconds: float = 0.25) -> dict[int, float]:
    """A yardstick of the machine's current speed: median seconds of one forward+backward of a gpt2-tiny transformer
    block (micro-batch 1, one thread) on each of ``cores`` (default: every core this process may use), run one core
    after the other for about ``seconds`` each. The process's affinity and thread count are restored."""
    import statistics

    import torch

    from ampe.costmodel.model import load_model
    from ampe.launch.gpt_pipe import build_layer

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
        a = Sample.now()
        time.sleep(self.window_s)
        b = Sample.now()
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
