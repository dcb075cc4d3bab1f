"""A fake ``pynvml`` for tests: records every call, never touches a GPU.

Inject with ``monkeypatch.setitem(sys.modules, "pynvml", module)``. Calls are appended to ``CALLS`` and, when the
environment variable ``AMPE_FAKE_NVML_LOG`` names a file, written there one per line (for subprocess tests).
``AMPE_FAKE_NVML`` marks the module as fake so ``ampe.measure.freq.import_nvml`` accepts it under pytest.
"""

from __future__ import annotations

import os

AMPE_FAKE_NVML = True
CALLS: list[tuple] = []
_energy_mj = [0]


class NVMLError(Exception):
    """Stand-in for pynvml.NVMLError."""


def _log(*call: object) -> None:
    CALLS.append(tuple(call))
    path = os.environ.get("AMPE_FAKE_NVML_LOG")
    if path:
        with open(path, "a") as f:
            f.write(" ".join(str(c) for c in call) + "\n")
            f.flush()
            os.fsync(f.fileno())


def nvmlInit() -> None:
    _log("init")


def nvmlShutdown() -> None:
    _log("shutdown")


def nvmlDeviceGetCount() -> int:
    return 2


def nvmlDeviceGetHandleByIndex(index: int) -> str:
    return f"gpu{index}"


def nvmlDeviceGetHandleByPciBusId(bus_id: str) -> str:
    return f"gpu@{bus_id}"


def nvmlDeviceGetName(handle: str) -> str:
    return "Fake A100-SXM4-40GB"


def nvmlDeviceSetGpuLockedClocks(handle: str, min_mhz: int, max_mhz: int) -> None:
    if os.environ.get("AMPE_FAKE_NVML_DENY"):  # a user without clock permissions
        raise NVMLError("Insufficient Permissions")
    _log("lock", handle, min_mhz, max_mhz)


def nvmlDeviceGetSupportedMemoryClocks(handle: str) -> list[int]:
    return [1215]


def nvmlDeviceGetSupportedGraphicsClocks(handle: str, memory_mhz: int) -> list[int]:
    return list(range(1410, 200, -15))  # A100's 1410 ... 210 MHz in 15 MHz steps


def nvmlDeviceResetGpuLockedClocks(handle: str) -> None:
    _log("reset", handle)


def nvmlDeviceGetTotalEnergyConsumption(handle: str) -> int:
    _energy_mj[0] += 1500  # +1.5 J per read
    return _energy_mj[0]


def clear() -> None:
    """Forget recorded calls."""
    CALLS.clear()
