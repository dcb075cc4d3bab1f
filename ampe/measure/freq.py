"""Frequency controllers: how a rank's plan turns into a clock, behind one small interface.

* ``nvml``: locks the GPU's SM clock with ``nvmlDeviceSetGpuLockedClocks(h, f, f)``, only when the clock changes,
  from a background thread (an NVML clock change takes about 10 ms, Perseus §5; EnvPipe and Zeus also set clocks
  off the training thread). It ALWAYS resets (``nvmlDeviceResetGpuLockedClocks``) on ``close``/``__exit__``, at
  interpreter exit, and on SIGTERM/SIGINT (then the signal's previous behaviour runs). Needs root/SYS_ADMIN.
* ``emulate``: for CPU trials. It cannot change a clock; instead it stretches each computation to its planned
  duration: run the op, measure its real duration ``d``, then *sleep* ``(ratio − 1)·d`` where
  ``ratio = t(f)/t(f_max)`` from the DVFS model. Sleeping (not busy-waiting) is deliberate: ranks of a CPU trial may
  share a core, and a spinning rank would slow the *other* simulated device on that core. ``time.sleep`` overshoots
  by tens of µs, so the last 200 µs are spun; the real stretch is measured and reported. A sleep can still wake
  milliseconds late when another process holds the core; that overshoot is taken off the next stretch, so the
  stretches add up to their targets (within the last one's overshoot).
* ``none``: records the requested clock (for energy accounting) and changes nothing.

``auto`` picks nvml when the device is CUDA and pynvml initialises, else emulate when a plan is given, else none.
Real NVML is never used under pytest (``PYTEST_CURRENT_TEST`` set): tests inject ``tests/support/fake_pynvml.py``.

:class:`ModelledEnergy` is the energy model used wherever no energy counter exists (every CPU trial): per
computation ``P(f)·t`` (busy power at its clock times its, stretched, duration) plus the blocking power for the rest of
the iteration (waiting on peers, p2p, optimizer bookkeeping), as in Perseus' Eq. 3. It is labelled "modelled".
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

from ampe.costmodel.catalog import GpuType

BACKENDS = ("auto", "none", "emulate", "nvml")
SPIN_TAIL_S = 200e-6  # emulate: sleep until this close to the deadline, then spin (sleep overshoots ~50-100 µs)


class Dvfs(Protocol):
    """Time and power of one GPU type as a function of its SM clock (``ampe.energy.dvfs`` bound to a GpuType)."""

    def time_ratio(self, mhz: float) -> float:
        """t(f)/t(f_max), ≥ 1."""

    def power_w(self, mhz: float) -> float:
        """Busy power at ``mhz``, watts."""

    def blocking_power_w(self) -> float:
        """Power while waiting (not computing), watts."""


@dataclass(frozen=True)
class CatalogDvfs:
    """The project's DVFS model (``ampe.energy.dvfs``) for one catalog GPU type, imported lazily."""

    gpu: GpuType

    def _dvfs(self) -> ModuleType:
        try:
            from ampe.energy import dvfs  # lazily: only trials that model energy or emulate clocks need it
        except ImportError as e:  # pragma: no cover - depends on the rest of the tree
            raise RuntimeError(f"the emulate backend and modelled energy need ampe.energy.dvfs ({e})") from None
        return dvfs

    def time_ratio(self, mhz: float) -> float:
        return float(self._dvfs().time_ratio(self.gpu, mhz))

    def power_w(self, mhz: float) -> float:
        return float(self._dvfs().power_w(self.gpu, mhz))

    def blocking_power_w(self) -> float:
        return float(self._dvfs().blocking_power_w(self.gpu))


# ---------------------------------------------------------------------------------------------------------------
# Energy model


@dataclass
class ModelledEnergy:
    """Energy of one rank from busy time per clock and the DVFS power model (joules; no counter involved)."""

    dvfs: Dvfs
    busy_j: float = 0.0
    busy_s: float = 0.0
    _power_cache: dict[float, float] = field(default_factory=dict)

    def add_busy(self, mhz: float, seconds: float) -> None:
        """One computation of ``seconds`` (stretched duration) at ``mhz``."""
        p = self._power_cache.get(mhz)
        if p is None:
            p = self._power_cache[mhz] = self.dvfs.power_w(mhz)
        self.busy_j += p * seconds
        self.busy_s += seconds

    def finish_iteration(self, iteration_s: float) -> float:
        """Joules of the iteration that took ``iteration_s``: busy energy + blocking power × the rest. Resets."""
        idle = max(0.0, iteration_s - self.busy_s)
        total = self.busy_j + self.dvfs.blocking_power_w() * idle
        self.busy_j = self.busy_s = 0.0
        return total


# ---------------------------------------------------------------------------------------------------------------
# Controllers


class FrequencyController:
    """Sets the clock of one device. ``set_mhz`` before a computation, ``computation()`` around it, ``reset`` to
    return the device to its default clocks, ``close`` when done (also via ``with``). This base is ``none``."""

    name = "none"
    modifies_clock = False

    def __init__(self) -> None:
        self.current_mhz: float | None = None

    def set_mhz(self, mhz: float) -> None:
        """Request ``mhz`` for the next computations."""
        self.current_mhz = mhz

    @contextlib.contextmanager
    def computation(self) -> Iterator[None]:
        """Wraps one forward/backward computation (emulate stretches it)."""
        yield

    def reset(self) -> None:
        """Back to the device's default clocks."""
        self.current_mhz = None

    def close(self) -> None:
        """Reset and release resources; idempotent."""
        self.reset()

    def stats(self) -> dict[str, Any] | None:
        """Backend-specific figures for the rank report (None when there are none)."""
        return None

    def __enter__(self) -> FrequencyController:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NoneController(FrequencyController):
    """Changes nothing (records the requested clock only)."""


class EmulateController(FrequencyController):
    """Stretches each computation by the DVFS time ratio of the requested clock (see the module docstring), times
    ``slowdown``: how much longer the emulated device type computes than the one the rank runs on (emulated mixed
    speeds; 1.0 for the fastest type, and without emulation)."""

    name = "emulate"

    def __init__(self, dvfs: Dvfs, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep, slowdown: float = 1.0) -> None:
        super().__init__()
        if not slowdown >= 1.0:
            raise ValueError(f"slowdown {slowdown} < 1: only a slower device than this one can be emulated")
        self.dvfs, self.slowdown = dvfs, slowdown
        self.ratio = slowdown
        self._clock, self._sleep = clock, sleep
        self._ratios: dict[float, float] = {}
        self.stretch_s = 0.0  # extra time actually waited, seconds
        self.target_stretch_s = 0.0  # extra time the ratios asked for, seconds
        self.computations = 0
        self.last_duration_s = 0.0  # real duration of the last computation (before stretching)
        self.last_stretch_s = 0.0
        self._late_s = 0.0  # stretch slept beyond the targets so far (late wake-ups), taken off the next stretch

    def set_mhz(self, mhz: float) -> None:
        super().set_mhz(mhz)
        r = self._ratios.get(mhz)
        if r is None:
            r = self._ratios[mhz] = self.dvfs.time_ratio(mhz)
            if not r >= 1.0:
                raise ValueError(f"time ratio {r} < 1 at {mhz} MHz: t(f)/t(f_max) must be ≥ 1")
        self.ratio = r * self.slowdown

    def reset(self) -> None:
        super().reset()
        self.ratio = self.slowdown

    @contextlib.contextmanager
    def computation(self) -> Iterator[None]:
        t0 = self._clock()
        yield
        t1 = self._clock()
        self.last_duration_s = t1 - t0
        target = (self.ratio - 1.0) * self.last_duration_s
        self.target_stretch_s += target
        # A sleep that wakes late (its core busy with another process) overshoots the deadline: the next stretch is
        # shorter by that much, so the stretches add up to their targets and the late wake-up is not emulated
        # device time.
        extra = target - self._late_s
        if extra > 0:
            deadline = t1 + extra
            if extra > SPIN_TAIL_S:
                self._sleep(extra - SPIN_TAIL_S)
            while self._clock() < deadline:
                pass
        self.last_stretch_s = self._clock() - t1 if extra > 0 else 0.0
        self._late_s += self.last_stretch_s - target  # ≥ 0: a stretch never ends before its deadline
        self.stretch_s += self.last_stretch_s
        self.computations += 1

    def stats(self) -> dict[str, Any]:
        return {"stretch_s": self.stretch_s, "target_stretch_s": self.target_stretch_s,
                "computations": self.computations, "method": "sleep (last 200 µs spun)", "slowdown": self.slowdown}


def _under_pytest() -> bool:
    return "PYTEST_CURRENT_TEST" in os.environ


def _is_fake(nvml: ModuleType) -> bool:
    return bool(getattr(nvml, "AMPE_FAKE_NVML", False))


def import_nvml() -> ModuleType:
    """The ``pynvml`` module (nvidia-ml-py). Under pytest it must be the fake one (tests/support/fake_pynvml.py)."""
    import pynvml

    if _under_pytest() and not _is_fake(pynvml):
        raise RuntimeError("refusing to use real NVML under pytest: inject tests/support/fake_pynvml.py as pynvml")
    return pynvml


class NvmlController(FrequencyController):
    """Locks the SM clock through NVML; always resets on exit, on exceptions and on SIGTERM/SIGINT."""

    name = "nvml"
    modifies_clock = True

    def __init__(self, handle: Any, nvml: ModuleType, asynchronous: bool = True,
                 handle_signals: bool = True) -> None:
        super().__init__()
        self.nvml, self.handle = nvml, handle
        self.locked = False
        self.changes = 0
        self.errors: list[str] = []
        self._closed = False
        self._lock = threading.RLock()  # re-entrant: a signal may arrive while the main thread holds it
        self._queue: queue.Queue[float | None] | None = None
        self._thread: threading.Thread | None = None
        if asynchronous:
            self._queue = queue.Queue()
            self._thread = threading.Thread(target=self._apply_loop, name="ampe-nvml-clock", daemon=True)
            self._thread.start()
        self._previous_handlers: dict[int, Any] = {}
        if handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous_handlers[sig] = signal.signal(sig, self._on_signal)
        atexit.register(self.close)

    # -- clock changes
    def _lock_clock(self, mhz: float) -> None:
        f = round(mhz)
        with self._lock:
            if self._closed:
                return
            try:
                self.nvml.nvmlDeviceSetGpuLockedClocks(self.handle, f, f)
                self.locked = True
                self.changes += 1
            except Exception as e:  # NVML errors must not kill training; they are reported
                self.errors.append(f"set {f} MHz: {e}")

    def _apply_loop(self) -> None:
        assert self._queue is not None
        while True:
            mhz = self._queue.get()
            try:
                if mhz is None:
                    return
                self._lock_clock(mhz)
            finally:
                self._queue.task_done()

    def set_mhz(self, mhz: float) -> None:
        """Lock the SM clock to ``mhz`` (min = max = f) if it differs from the current one."""
        if self._closed or mhz == self.current_mhz:
            return
        super().set_mhz(mhz)
        if self._queue is not None:
            self._queue.put(mhz)
        else:
            self._lock_clock(mhz)

    def flush(self) -> None:
        """Wait until every requested change has been applied."""
        if self._queue is not None and self._thread is not None and self._thread.is_alive():
            self._queue.join()

    def reset(self) -> None:
        """Unlock the SM clock (``nvmlDeviceResetGpuLockedClocks``); safe to call any number of times."""
        self.flush()
        with self._lock:
            try:
                self.nvml.nvmlDeviceResetGpuLockedClocks(self.handle)
            except Exception as e:
                self.errors.append(f"reset: {e}")
            self.locked = False
            self.current_mhz = None

    def close(self) -> None:
        if self._closed:
            return
        if self._queue is not None and self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout=5.0)
        self.reset()
        self._closed = True
        for sig, prev in self._previous_handlers.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, prev)
        self._previous_handlers = {}
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)

    def _on_signal(self, signum: int, frame: Any) -> None:
        prev = self._previous_handlers.get(signum, signal.SIG_DFL)
        self.close()  # resets the clock and restores the previous handlers
        if callable(prev):
            prev(signum, frame)
        elif prev == signal.SIG_IGN:
            return
        else:  # default action: die of the same signal, so the parent sees "killed by signal"
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def stats(self) -> dict[str, Any]:
        return {"clock_changes": self.changes, "errors": self.errors[:5]}


@dataclass
class NvmlEnergyMeter:
    """Energy from the GPU's cumulative counter (``nvmlDeviceGetTotalEnergyConsumption``, millijoules)."""

    handle: Any
    nvml: ModuleType

    def read_j(self) -> float:
        """Joules consumed since the driver loaded."""
        return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1000.0


#: The ``energy_source`` of joules from :class:`ModelledEnergyMeter`: a model, never a measurement.
MODELLED_METER = "modelled (no energy counter: catalog busy power at the maximum clock × time)"


@dataclass
class ModelledEnergyMeter:
    """Joules-so-far of a device kept busy at ``mhz``: the DVFS model's busy power × elapsed time. What the profiler
    reads where no energy counter exists (a CPU), so that a CPU profile has the energy columns a GPU's has; every
    figure from it is labelled :data:`MODELLED_METER`."""

    dvfs: Dvfs
    mhz: float
    clock: Callable[[], float] = time.perf_counter

    def read_j(self) -> float:
        """Modelled joules since an arbitrary origin (only differences mean anything)."""
        return self.dvfs.power_w(self.mhz) * self.clock()


def nvml_handle(nvml: ModuleType, pci_bus_id: str | None, index: int) -> Any:
    """The NVML handle of a CUDA device: by PCI bus id when known (NVML indices ignore CUDA_VISIBLE_DEVICES)."""
    if pci_bus_id:
        with contextlib.suppress(Exception):
            return nvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
    return nvml.nvmlDeviceGetHandleByIndex(index)


def try_init_nvml() -> ModuleType | None:
    """pynvml initialised, or None where it is missing or cannot initialise (no driver)."""
    try:
        nvml = import_nvml()
        nvml.nvmlInit()
        return nvml
    except Exception:
        return None


def rank_backend(requested: str, device: str, has_plan: bool, nvml_ok: Callable[[], bool] | None = None) -> str:
    """The concrete backend for ``requested`` ∈ BACKENDS (see the module docstring for ``auto``)."""
    if requested not in BACKENDS:
        raise ValueError(f"unknown frequency backend {requested!r}; one of {', '.join(BACKENDS)}")
    if requested != "auto":
        if requested == "nvml" and device != "cuda":
            raise ValueError("the nvml backend needs a CUDA device")
        return requested
    if device == "cuda" and not _under_pytest():
        ok = nvml_ok() if nvml_ok is not None else try_init_nvml() is not None
        if ok:
            return "nvml"
    return "emulate" if has_plan else "none"


def gpu_dvfs(gpu: GpuType) -> Dvfs:
    """The DVFS model of ``gpu`` (the project's ``ampe.energy.dvfs``)."""
    return CatalogDvfs(gpu)


__all__ = [
    "BACKENDS",
    "MODELLED_METER",
    "CatalogDvfs",
    "Dvfs",
    "EmulateController",
    "FrequencyController",
    "ModelledEnergy",
    "ModelledEnergyMeter",
    "NoneController",
    "NvmlController",
    "NvmlEnergyMeter",
    "gpu_dvfs",
    "import_nvml",
    "nvml_handle",
    "rank_backend",
    "try_init_nvml",
]
