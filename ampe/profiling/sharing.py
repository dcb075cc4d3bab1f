"""Time-sharing efficiency of a CPU: the throughput its cores keep when each runs two trial ranks instead of one.

CPU emulation runs more trial ranks than cores (4 ranks on 2 cores). An OS scheduler gives each of two CPU-bound
processes half a core, but the two also evict each other's caches on every switch and compete for the shared cache
and memory bandwidth, so together they get less than one core's work done. The cost model takes this loss as the
node's ``sharing_efficiency`` (:mod:`ampe.costmodel.cluster`); this module measures it with the very layers a trial
runs:

* every process builds the model's whole layer stack (embedding to the LM head with its loss), pins itself to a
  core, warms up, then runs forward+backward pairs on one micro-batch inside a common wall-clock window (all
  processes start and stop together, so every core is loaded throughout);
* run A puts one process on each of ``cores`` cores, run B two on each; efficiency = 2·t_A / t_B with t the median
  seconds per pair over the processes of a run, and the median over ``rounds`` alternating A/B pairs of runs;
* the processes are started once, two per core: in run A the second of each core waits idle on its input (it uses
  no CPU), so imports, builds and warm-ups are paid once rather than per run.

The reference is run A, not a process alone on an idle machine: the profile the cost model uses is taken with one
process per core, and the loss to isolate is the one of sharing a core.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

LEAD_S = 60.0  # seconds the workers may take to import, build and warm up before they say they are ready
READY_TIMEOUT_S = 60.0  # beyond the lead: a worker still not ready then is hung
GO_LEAD_S = 1.0  # the common start, this many seconds after the last worker is ready
MAX_LATE_S = 0.5  # a worker that starts later than this missed too much of the common window


@dataclass(frozen=True)
class SharingMeasurement:
    """Measured time-sharing efficiency (dimensionless, 1 = no loss) and the runs behind it (seconds per pair)."""

    efficiency: float
    cores: tuple[int, ...]
    mbs: int
    one_per_core_s: tuple[float, ...]  # per round: median seconds per forward+backward pair, one process per core
    two_per_core_s: tuple[float, ...]  # the same with two processes per core

    def describe(self) -> str:
        """One line: the efficiency and the per-round timings behind it (milliseconds)."""
        return (f"cores {list(self.cores)} keep {self.efficiency:.3f} of their throughput when two ranks share each "
                f"(forward+backward of the whole model at mbs {self.mbs}: "
                f"{', '.join(f'{a * 1e3:.1f}' for a in self.one_per_core_s)} ms with one rank per core, "
                f"{', '.join(f'{b * 1e3:.1f}' for b in self.two_per_core_s)} ms with two)")


def measure_sharing_efficiency(model_name: str, mbs: int = 1, seconds: float = 5.0, rounds: int = 3,
                               cores: Sequence[int] | None = None, lead_s: float = LEAD_S) -> SharingMeasurement:
    """Measure the sharing efficiency of ``cores`` on ``model_name``'s layers.

    Two workers per core are started once (imports, build and warm-up are paid once, not per run); run A asks the
    first of each core to measure while the second waits idle on its input, run B asks both.

    Args:
        model_name: a zoo model; its whole layer stack runs forward+backward.
        mbs: micro-batch size (samples).
        seconds: length of each run's common window (s).
        rounds: A/B pairs of runs; the efficiency is the median of their ratios.
        cores: the cores to measure (default: every core this process may use).
        lead_s: how long the workers may take to import, build and warm up (s).

    Returns:
        The efficiency and the per-round seconds per forward+backward pair.

    Raises:
        RuntimeError: a worker failed, hung or started late.
    """
    cores = tuple(sorted(os.sched_getaffinity(0)) if cores is None else cores)
    workers = _start([c for c in cores for _ in range(2)], model_name, mbs, lead_s)
    one, two = [], []
    try:
        for _ in range(rounds):
            one.append(_run(workers[0::2], seconds))
            two.append(_run(workers, seconds))
    finally:  # one failure ends the measurement: no worker outlives it
        for w in workers:
            w.end()
    ratios = [2 * a / b for a, b in zip(one, two, strict=False)]
    return SharingMeasurement(statistics.median(ratios), cores, mbs, tuple(one), tuple(two))


@dataclass
class _Worker:
    """One measuring process and what it printed (stdout and stderr together, read without buffering, so that a
    wait on its pipe never misses lines already read; what is not a message is kept for the error)."""

    proc: subprocess.Popen
    pending: bytes = b""
    other: str = ""  # the last lines that were not messages (warnings, a traceback)

    def message(self, deadline: float, hung: str) -> str | None:
        """The next line that is ``ready`` or a JSON object, or None at the end of its output; a RuntimeError
        (``hung`` says what was late) when none comes before ``deadline`` (``time.monotonic()``)."""
        import selectors

        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" not in self.pending:
                with selectors.DefaultSelector() as sel:
                    sel.register(fd, selectors.EVENT_READ)
                    if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                        raise RuntimeError(f"sharing worker hung ({hung})")
                data = os.read(fd, 65536)
                if not data:
                    return None
                self.pending += data
            raw, self.pending = self.pending.split(b"\n", 1)
            line = raw.decode(errors="replace").strip()
            if line == "ready" or line.startswith("{"):
                return line
            self.other = (self.other + "\n" + line)[-500:]

    def failed(self) -> RuntimeError:
        """The error of a worker whose output ended early: its exit status and last lines."""
        self.end()
        return RuntimeError(f"sharing worker failed (exit {self.proc.returncode}): {self.other.strip()}")

    def end(self) -> None:
        """Stop it if it still runs."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _start(cores: list[int], model_name: str, mbs: int, lead_s: float) -> list[_Worker]:
    """One worker per entry of ``cores`` (pinned there), each ready: imported, built and warmed up within ``lead_s``
    (a loaded machine takes longer, never wrongly) plus :data:`READY_TIMEOUT_S`."""
    workers = [_Worker(subprocess.Popen([sys.executable, "-m", "ampe.profiling.sharing", model_name, str(mbs),
                                         str(core)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, bufsize=0)) for core in cores]
    try:
        deadline = time.monotonic() + lead_s + READY_TIMEOUT_S
        for w in workers:
            if w.message(deadline, "not ready before the deadline") != "ready":
                raise w.failed()
    except BaseException:
        for w in workers:
            w.end()
        raise
    return workers


def _run(workers: list[_Worker], seconds: float) -> float:
    """One run: every worker of ``workers`` measures for ``seconds`` from a common start; the median seconds per pair.

    The parent, not a clock, starts the measurement together: once all are ready it sends every worker one common
    start time :data:`GO_LEAD_S` ahead."""
    start_at = time.time() + GO_LEAD_S
    for w in workers:
        assert w.proc.stdin is not None
        w.proc.stdin.write(f"{start_at!r} {seconds!r}\n".encode())
    deadline = time.monotonic() + GO_LEAD_S + seconds + 120
    per_pair = []
    for w in workers:
        line = w.message(deadline, f"no result {seconds + 120:.0f} s after the start")
        try:
            result = json.loads(line or "")
            late, per = float(result["late_s"]), float(result["seconds_per_pair"])
        except (ValueError, KeyError, TypeError):
            raise w.failed() from None
        if late > MAX_LATE_S:
            raise RuntimeError(f"sharing worker started {late:.1f} s late: the machine is too busy to measure")
        per_pair.append(per)
    return statistics.median(per_pair)


def _worker(model_name: str, mbs: int, core: int) -> None:
    """One measuring process: pinned to ``core``; builds and warms up, says ``ready``, then for each line of stdin
    (a common start time and a window in s) runs forward+backward pairs of the whole model in that window and prints
    one JSON result; ends at the end of its input."""
    os.sched_setaffinity(0, {core})
    import torch

    from ampe.costmodel.zoo import load_model
    from ampe.profiling.profiler import build_runtime_layer
    from ampe.runtime.gpt_pipe import lm_loss

    torch.set_num_threads(1)
    model = load_model(model_name)
    torch.manual_seed(0)
    layers = [build_runtime_layer(model, i).train() for i in range(model.num_layers)]
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, model.vocab, (mbs, model.seq_len), generator=gen)
    labels = torch.randint(0, model.vocab, (mbs, model.seq_len), generator=gen)

    def pair() -> None:
        x = tokens
        for layer in layers:
            x = layer(x)
        lm_loss(x, labels).backward()
        for layer in layers:
            layer.zero_grad(set_to_none=True)

    for _ in range(3):
        pair()
    print("ready", flush=True)
    for line in sys.stdin:
        start_at, seconds = (float(v) for v in line.split())
        late = time.time() - start_at
        while time.time() < start_at:
            time.sleep(min(0.01, max(start_at - time.time(), 0.0)))
        end = start_at + seconds
        n, t0 = 0, time.perf_counter()
        while time.time() < end:
            pair()
            n += 1
        print(json.dumps({"seconds_per_pair": (time.perf_counter() - t0) / max(n, 1), "pairs": n,
                          "late_s": max(late, 0.0)}), flush=True)


if __name__ == "__main__":
    name, mbs_arg, core_arg = sys.argv[1:4]
    _worker(name, int(mbs_arg), int(core_arg))
