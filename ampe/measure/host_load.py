"""How busy the host's CPUs were with *other* work while a trial measured (machine-wide CPU times via psutil).

CPU trials on a shared machine are slowed by whatever else runs there, and nothing in the trial's own figures shows
it. The worker therefore reads the machine-wide busy CPU time (``psutil.cpu_times``: user + nice + system + irq +
softirq + steal) around its timed iterations, every rank reads its own process CPU time
(``time.process_time``: all its threads), and ``other_cores = (machine busy − Σ ranks' own) / wall`` is the number
of cores other processes kept busy on average (``host_other_cores`` in ``result.json``; ~0 on a quiet machine). On
GPUs the figure still says whether the host CPUs were contended (data loading, other jobs); it is not a GPU
measurement. Resolution: one tick is 10 ms per core, so over a window of a second the figure is good to ~0.02 cores.

Which of the trial's own threads were held back by that work shows in the scheduler's account of the calling
thread (``/proc/thread-self/schedstat``, Linux): its run-queue wait, the seconds it was ready to run while its core
ran something else (:func:`run_queue_wait_s`; the rank report's ``waited_s_per_iter``). Exact (nanoseconds).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

_BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal")  # idle and iowait are not busy
SCHEDSTAT = "/proc/thread-self/schedstat"  # on-CPU ns, run-queue wait ns, time slices of the calling thread


def machine_busy_s() -> float | None:
    """Seconds of CPU time every core of the machine has spent busy since boot, or None where unavailable."""
    try:
        import psutil
    except ImportError:  # psutil comes with the `trial` extra; without it the figure is simply not measured
        return None
    times = psutil.cpu_times()
    return float(sum(getattr(times, f, 0.0) for f in _BUSY_FIELDS))


def run_queue_wait_s() -> float | None:
    """Seconds the calling thread has spent ready to run but waiting for its core (held by other threads) since it
    started, or None where the kernel does not say (off Linux)."""
    try:
        with open(SCHEDSTAT, "rb") as f:
            return int(f.read().split()[1]) * 1e-9
    except (OSError, IndexError, ValueError):
        return None


@dataclass(frozen=True)
class LoadSample:
    """One reading: wall clock, machine-wide busy CPU seconds (None off Linux), this process's CPU seconds, the
    calling thread's run-queue wait (seconds, None off Linux)."""

    wall_s: float
    machine_busy_s: float | None
    own_cpu_s: float
    waited_s: float | None = None

    @classmethod
    def now(cls) -> LoadSample:
        """Read the clocks."""
        return cls(time.perf_counter(), machine_busy_s(), time.process_time(), run_queue_wait_s())


def other_cores(start_busy_s: float | None, end_busy_s: float | None, own_cpu_s: float, wall_s: float) -> float | None:
    """Average number of cores other processes kept busy over ``wall_s`` seconds (≥ 0), given the machine's busy
    seconds at the start and end of the window and the CPU seconds the trial's own processes used in it."""
    if start_busy_s is None or end_busy_s is None or wall_s <= 0:
        return None
    return max(0.0, (end_busy_s - start_busy_s - own_cpu_s) / wall_s)
