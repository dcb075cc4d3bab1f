"""Per-clock profiling (``ampe profile --device cuda --clocks all|LIST``): the layer profile repeated with the GPU's
SM clock locked at each clock, rows tagged ``sm_clock_mhz``.

Clocks are locked through NVML (:class:`ampe.measure.freq.NvmlController`: ``nvmlDeviceSetGpuLockedClocks(f, f)``)
and ALWAYS reset: after the last clock, on any exception (a failing layer, Ctrl-C) and on SIGTERM/SIGINT (the
controller's handlers reset, then the signal's previous behaviour runs). A user without the permission to lock
clocks (NVML "Insufficient Permissions"; root or CAP_SYS_ADMIN is needed on most drivers) gets
:class:`ClockPermissionError` before anything is measured. Tested only against tests/support/fake_pynvml.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from ampe.errors import InputError
from ampe.formats.profile import ProfileRow

MAX_CLOCKS = 256  # more clocks than any GPU offers


class ClockPermissionError(InputError):
    """NVML refused to lock the clock (no permission, or not supported on this GPU)."""


def supported_clocks(nvml: ModuleType, handle: Any) -> list[int]:
    """The SM clocks (MHz) the GPU supports at its highest memory clock, highest first."""
    memory = max(nvml.nvmlDeviceGetSupportedMemoryClocks(handle))
    return sorted({int(f) for f in nvml.nvmlDeviceGetSupportedGraphicsClocks(handle, memory)}, reverse=True)


def parse_clocks(text: str, supported: Sequence[int]) -> list[int]:
    """``all`` or a comma-separated list of MHz, each one the GPU supports; highest first. Raises InputError."""
    if text.strip() == "all":
        return sorted(supported, reverse=True)
    try:
        wanted = {int(x) for x in text.split(",") if x.strip()}
    except ValueError:
        raise InputError("--clocks", "", f"expected 'all' or comma-separated MHz, got {text!r}") from None
    if not wanted or len(wanted) > MAX_CLOCKS:
        raise InputError("--clocks", "", f"expected 1..{MAX_CLOCKS} clocks, got {text!r}")
    bad = sorted(wanted - set(supported))
    if bad:
        near = ", ".join(str(f) for f in sorted(supported, reverse=True)[:6])
        raise InputError("--clocks", "", f"{bad[0]} MHz is not a supported SM clock of this GPU (e.g. {near} …)")
    return sorted(wanted, reverse=True)


def profile_at_clocks(clocks: Sequence[int], controller: Any, run: Callable[[], list[ProfileRow]],
                      progress: Callable[[str], None] | None = None) -> list[ProfileRow]:
    """Lock each clock (MHz) with ``controller`` (an NvmlController), call ``run`` to profile every layer, and tag
    its rows with the clock. The controller is closed — the clock reset — whatever happens."""
    rows: list[ProfileRow] = []
    try:
        for i, mhz in enumerate(clocks, start=1):
            controller.set_mhz(mhz)
            controller.flush()
            if controller.errors:
                raise ClockPermissionError("--clocks", "", f"NVML refused to lock the SM clock at {mhz} MHz "
                                           f"({controller.errors[0]}); locking clocks needs root or CAP_SYS_ADMIN")
            rows += [r.model_copy(update={"sm_clock_mhz": mhz}) for r in run()]
            if progress is not None:
                progress(f"clock {mhz} MHz done ({i}/{len(clocks)})")
    finally:
        controller.close()
    return rows
