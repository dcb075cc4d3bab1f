"""One rank's frequency machinery: the hook, its controller (``nvml``, ``emulate``, ``none``), the NVML energy meter
and the modelled energy account — built the same way for ampe's worker and for the user's own script
(:mod:`ampe.runtime.user`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ampe.costmodel.catalog import GpuType
from ampe.measure import freq, host_load
from ampe.runtime.hook import FrequencyHook, PlannedStep


@dataclass
class FrequencyRun:
    """The hook of one rank and what it drives. Use as a context manager around training: leaving it closes the
    controller, which resets any locked clocks."""

    hook: FrequencyHook
    controller: freq.FrequencyController
    energy: freq.ModelledEnergy | None  # modelled joules, when there is no NVML meter
    meter: freq.NvmlEnergyMeter | None  # NVML's cumulative energy counter
    backend: str  # nvml | emulate | none

    def install(self, engine: Any) -> FrequencyRun:
        """Wrap the forward/backward/optimizer instructions of a stock ``PipelineEngine`` (see
        :class:`~ampe.runtime.hook.FrequencyHook`); returns self."""
        self.hook.install(engine)
        return self

    @property
    def energy_source(self) -> str | None:
        """``nvml`` (measured), ``modelled`` (DVFS power model × busy time) or None (no energy figure)."""
        return "nvml" if self.meter is not None else ("modelled" if self.energy is not None else None)

    def __enter__(self) -> FrequencyRun:
        self.controller.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.controller.__exit__(*exc)


def stage_steps(frequency_plan: Any, stage: int, replica: int) -> tuple[PlannedStep, ...]:
    """This rank's plan: the ``(instruction, micro-batch, MHz)`` list of ``stage`` in data-parallel ``replica``
    (a :class:`~ampe.formats.frequency_plan.FrequencyPlan`)."""
    stages = frequency_plan.replica_stages(replica)
    return tuple(PlannedStep(i, mb, float(mhz)) for i, mb, mhz in stages[stage])


def frequency_run(plan: Sequence[PlannedStep] | None, requested: str, device: str, gpu: GpuType, stage: int,
                  torch: Any, slowdown: float = 1.0) -> FrequencyRun:
    """Build the hook for one rank. ``requested`` ∈ nvml | emulate | none | auto (``freq.rank_backend``); ``device``
    is ``cpu`` or ``cuda`` (the current CUDA device must already be selected); ``gpu`` the rank's device type,
    whose DVFS model stretches (emulate) and prices (modelled energy) the computations; ``slowdown`` (≥ 1) how much
    longer the emulated device type computes than this one (emulated mixed speeds: every computation is stretched by
    it, whatever the backend but nvml, which runs the real device)."""
    nvml = freq.try_init_nvml() if device == "cuda" else None
    backend = freq.rank_backend(requested, device, plan is not None, lambda: nvml is not None)
    meter, handle = None, None
    if nvml is not None:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        bus = getattr(props, "pci_bus_id", None)
        handle = freq.nvml_handle(nvml, f"{bus:08x}" if isinstance(bus, int) else bus, torch.cuda.current_device())
        meter = freq.NvmlEnergyMeter(handle, nvml)
    dvfs = freq.gpu_dvfs(gpu)
    controller: freq.FrequencyController
    if backend == "nvml":
        if slowdown != 1.0:
            raise ValueError("emulated speeds stretch computations on CPUs; the nvml backend runs the real GPU")
        if nvml is None:
            raise RuntimeError("freq_backend nvml: pynvml could not initialise on this machine")
        controller = freq.NvmlController(handle, nvml)
    elif backend == "emulate" or slowdown != 1.0:
        controller = freq.EmulateController(dvfs, slowdown=slowdown)
    else:
        controller = freq.NoneController()
    energy = None
    if meter is None:
        try:
            dvfs.power_w(gpu.sm_clock_max_mhz)
            energy = freq.ModelledEnergy(dvfs)
        except RuntimeError:
            if backend == "emulate":
                raise
    sync = torch.cuda.synchronize if device == "cuda" and (plan is not None or energy is not None) else None
    # on cores, each computation's run-queue wait (other work on its core) is recorded: it is part of what the
    # emulation stretches
    waited = host_load.run_queue_wait_s if device == "cpu" else None
    hook = FrequencyHook(plan, controller, energy, default_mhz=gpu.sm_clock_max_mhz, sync=sync, stage=stage,
                         waited=waited)
    return FrequencyRun(hook, controller, energy, meter, backend)
