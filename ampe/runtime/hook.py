"""The frequency-schedule hook: before every forward and backward instruction of DeepSpeed's pipeline engine, the
rank's plan sets the clock through a controller, and the executed sequence is checked against the plan.

DeepSpeed's ``PipelineEngine._exec_schedule`` binds ``self._INSTRUCTION_MAP[type(cmd)]`` with ``MethodType``, so
patching ``engine._exec_forward_pass`` does nothing; the hook gives the *engine instance* its own copy of the map
with the ForwardPass/BackwardPass (and OptimizerStep, for timing) entries wrapped. The class attribute is never
touched, so other engines in the process are unaffected and stock DeepSpeed stays unmodified.

A plan (one per pipeline stage) is one iteration of ``(instruction, micro-batch, MHz)`` in execution order. DeepSpeed
instructions carry buffer ids, not micro-batch ids; micro-batches enter and leave a 1F1B pipeline in order, so the
k-th forward (backward) of an iteration is micro-batch k. The first executed step that differs from the plan, an
iteration with steps the plan lacks, or a plan step never executed is a mismatch: it is recorded
(``instructions_ok = False`` with a message), the controller is reset and the plan is not applied further.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ampe.measure.freq import FrequencyController, ModelledEnergy

INSTRUCTIONS = ("forward", "backward")


@dataclass(frozen=True)
class PlannedStep:
    """One planned computation: ``instruction`` of ``microbatch`` at ``mhz``."""

    instruction: str
    microbatch: int
    mhz: float


@dataclass(frozen=True)
class Computation:
    """One executed computation: its real duration and the stretch the controller added (seconds)."""

    instruction: str
    microbatch: int
    mhz: float | None
    seconds: float  # wall time including any emulated stretch
    stretch_s: float
    # run-queue wait within the real computation (its core ran other work); None where not measured (GPUs)
    waited_s: float | None = None


class FrequencyHook:
    """Applies one stage's plan through ``controller``, checks the executed sequence, times computations and feeds
    the modelled energy account (when given). ``default_mhz`` is the clock assumed without a plan (f_max);
    ``waited`` (CPU runs) reads the training thread's run-queue wait, seconds
    (:func:`ampe.measure.host_load.run_queue_wait_s`), recorded per computation."""

    def __init__(self, plan: Sequence[PlannedStep] | None, controller: FrequencyController,
                 energy: ModelledEnergy | None = None, default_mhz: float | None = None,
                 sync: Callable[[], None] | None = None, clock: Callable[[], float] = time.perf_counter,
                 stage: int = 0, waited: Callable[[], float | None] | None = None) -> None:
        self.plan = tuple(plan) if plan is not None else None
        self.controller, self.energy = controller, energy
        self.default_mhz, self.sync, self.clock, self.stage = default_mhz, sync, clock, stage
        self.waited = waited
        self.active = self.plan is not None  # applying the plan (False after a mismatch)
        self.enabled = True  # False: the coming iterations run without the plan (interleaved A/B measurement)
        self.ok = True
        self.mismatch: str | None = None
        self.iteration = 0
        self.applied_steps = 0  # plan steps applied over the whole run
        self._pos = 0
        self._counts = {"forward": 0, "backward": 0}
        self.records: list[Computation] = []

    # -- plan bookkeeping
    def _fail(self, message: str) -> None:
        self.ok, self.mismatch, self.active = False, f"stage {self.stage}, iteration {self.iteration}: {message}", False
        self.controller.reset()

    def set_enabled(self, enabled: bool) -> None:
        """Apply the plan in the coming iterations or not (call between iterations). Disabled iterations run at
        the device's default clock and are not checked against the plan."""
        self.enabled = enabled
        if not enabled:
            self.controller.reset()

    def begin(self, instruction: str) -> float | None:
        """Called before a computation: check it against the plan and set its clock. Returns the clock in MHz
        (the plan's, else ``default_mhz``)."""
        mb = self._counts[instruction]
        self._counts[instruction] += 1
        if self.active and self.enabled and self.plan is not None:
            if self._pos >= len(self.plan):
                self._fail(f"executed {instruction} of micro-batch {mb} after all {len(self.plan)} planned steps")
            else:
                step = self.plan[self._pos]
                if (step.instruction, step.microbatch) != (instruction, mb):
                    self._fail(f"step {self._pos}: plan says {step.instruction} of micro-batch {step.microbatch}, "
                               f"DeepSpeed executed {instruction} of micro-batch {mb}")
                else:
                    if self.sync is not None:
                        self.sync()  # the previous computation finishes at its own clock
                    self.controller.set_mhz(step.mhz)
                    self._pos += 1
                    self.applied_steps += 1
                    return step.mhz
        return self.default_mhz

    def run(self, instruction: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run one forward/backward computation under the plan: set the clock, run (stretched by the controller),
        time it and account its energy."""
        mhz = self.begin(instruction)
        mb = self._counts[instruction] - 1
        t0 = self.clock()
        with self.controller.computation():
            w0 = self.waited() if self.waited is not None else None
            out = fn(*args, **kwargs)
            if self.sync is not None:
                self.sync()
            # read inside the timed span, before the stretch: the computation's own wait, not a late wake-up from
            # the stretch's sleep (the two reads add about 25 µs to the span)
            w1 = self.waited() if self.waited is not None else None
        seconds = self.clock() - t0
        if self.energy is not None and mhz is not None:
            self.energy.add_busy(mhz, seconds)
        self.records.append(Computation(instruction, mb, mhz, seconds, getattr(self.controller, "last_stretch_s", 0.0),
                                        None if w0 is None or w1 is None else w1 - w0))
        return out

    def run_other(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a non-planned computation (the optimizer step): timed and charged at the current clock, not
        stretched."""
        t0 = self.clock()
        out = fn(*args, **kwargs)
        if self.sync is not None:
            self.sync()
        mhz = self.controller.current_mhz or self.default_mhz
        if self.energy is not None and mhz is not None:
            self.energy.add_busy(mhz, self.clock() - t0)
        return out

    def end_iteration(self) -> list[Computation]:
        """Close one iteration: a plan not fully executed is a mismatch; rewind for the next. Returns its
        computations."""
        if self.active and self.enabled and self.plan is not None and self._pos != len(self.plan):
            self._fail(f"only {self._pos} of the plan's {len(self.plan)} steps were executed")
        self._pos = 0
        self._counts = {"forward": 0, "backward": 0}
        self.iteration += 1
        records, self.records = self.records, []
        return records

    # -- DeepSpeed
    def install(self, engine: Any) -> None:
        """Wrap ForwardPass/BackwardPass/OptimizerStep of this engine instance (its own copy of the map)."""
        from deepspeed.runtime.pipe import schedule

        base = dict(engine._INSTRUCTION_MAP)  # the instance's own map if something (ampe.runtime.freeze) set one
        fwd, bwd, opt = base[schedule.ForwardPass], base[schedule.BackwardPass], base[schedule.OptimizerStep]

        def forward(eng: Any, **kw: Any) -> Any:
            return self.run("forward", fwd, eng, **kw)

        def backward(eng: Any, **kw: Any) -> Any:
            return self.run("backward", bwd, eng, **kw)

        def optimizer_step(eng: Any, **kw: Any) -> Any:
            return self.run_other(opt, eng, **kw)

        base.update({schedule.ForwardPass: forward, schedule.BackwardPass: backward,
                     schedule.OptimizerStep: optimizer_step})
        engine._INSTRUCTION_MAP = base


def deepspeed_order(stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """The (instruction, micro-batch) order DeepSpeed's ``TrainSchedule`` executes on ``stage`` (its own
    generator, so plans can be checked before launching)."""
    from deepspeed.runtime.pipe import schedule

    order: list[tuple[str, int]] = []
    counts = {"forward": 0, "backward": 0}
    for cmds in schedule.TrainSchedule(micro_batches=micro_batches, stages=stages, stage_id=stage).steps():
        for cmd in cmds:
            name = ("forward" if isinstance(cmd, schedule.ForwardPass)
                    else "backward" if isinstance(cmd, schedule.BackwardPass) else None)
            if name:
                order.append((name, counts[name]))
                counts[name] += 1
    return order
