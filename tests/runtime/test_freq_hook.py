"""The frequency-schedule hook: plan parsing, sequence check (match and mismatch), and that its per-engine
instruction map is what DeepSpeed's real ``_exec_schedule`` runs under the real 1F1B ``TrainSchedule``."""

from __future__ import annotations

from typing import ClassVar

import pytest

from ampe.errors import InputError
from ampe.formats.frequency_plan import FrequencyPlan
from ampe.measure.freq import EmulateController, FrequencyController, ModelledEnergy
from ampe.runtime.hook import FrequencyHook, PlannedStep, deepspeed_order


class Recorder(FrequencyController):
    def __init__(self):
        super().__init__()
        self.log = []

    def set_mhz(self, mhz):
        super().set_mhz(mhz)
        self.log.append(("set", mhz))

    def reset(self):
        super().reset()
        self.log.append(("reset",))


def plan_for(order, fwd_mhz=1200, bwd_mhz=1400):
    return [PlannedStep(i, m, fwd_mhz + 10 * m if i == "forward" else bwd_mhz + 10 * m) for i, m in order]


def run_sequence(hook, order):
    for instruction, _ in order:
        hook.run(instruction, lambda: None)
    return hook.end_iteration()


def test_deepspeed_1f1b_order_matches_prior_art():
    # prior_art.md §5: stage 0 of 2 with 4 micro-batches runs F F B F B F B B.
    assert deepspeed_order(0, 2, 4) == [("forward", 0), ("forward", 1), ("backward", 0), ("forward", 2),
                                        ("backward", 1), ("forward", 3), ("backward", 2), ("backward", 3)]
    last = deepspeed_order(1, 2, 4)
    assert [i for i, _ in last] == ["forward", "backward"] * 4
    assert sorted(deepspeed_order(2, 4, 8)) == sorted([(i, m) for i in ("forward", "backward") for m in range(8)])


def test_stage_plans_are_validated_by_the_frequency_plan_model():
    plan = FrequencyPlan.parse({"stages": [[["forward", 0, 1500], ["backward", 0, 1800]]]}, "job.json",
                               "frequency_plan")
    assert plan.stages[0] == [("forward", 0, 1500), ("backward", 0, 1800)]
    for bad in ([["sideways", 0, 1]], [["forward", -1, 1000]], [["forward", 0, 0]], [["forward", 0]],
                [["forward", True, 1000]], [["forward", 0, 1800.5]], [["forward", 0, 10 ** 6]], "forward"):
        with pytest.raises(InputError) as e:
            FrequencyPlan.parse({"stages": [bad]}, "job.json", "frequency_plan")
        assert e.value.field.startswith("frequency_plan.stages[0]")


def test_matching_plan_sets_every_clock_in_order_each_iteration():
    order = deepspeed_order(0, 2, 4)
    plan = plan_for(order)
    ctl = Recorder()
    hook = FrequencyHook(plan, ctl, default_mhz=2000)
    for _ in range(3):
        records = run_sequence(hook, order)
        assert [(r.instruction, r.microbatch, r.mhz) for r in records] == [(s.instruction, s.microbatch, s.mhz)
                                                                          for s in plan]
    assert hook.ok and hook.mismatch is None and hook.active
    assert ctl.log == [("set", s.mhz) for s in plan] * 3
    assert hook.applied_steps == 3 * len(plan)


def test_mismatch_is_reported_and_the_plan_is_not_applied_further():
    executed = deepspeed_order(0, 2, 4)  # 1F1B: F0 F1 B0 ...
    gpipe = [("forward", m) for m in range(4)] + [("backward", m) for m in range(4)]
    ctl = Recorder()
    hook = FrequencyHook(plan_for(gpipe), ctl, default_mhz=2000, stage=0)
    records = run_sequence(hook, executed)
    assert not hook.ok
    assert "step 2" in hook.mismatch and "forward of micro-batch 2" in hook.mismatch
    assert "backward of micro-batch 0" in hook.mismatch and hook.mismatch.startswith("stage 0, iteration 0")
    assert ctl.log == [("set", 1200), ("set", 1210), ("reset",)]  # two steps applied, then reset, nothing more
    assert [r.mhz for r in records[2:]] == [2000] * 6  # the rest ran at the default clock
    run_sequence(hook, executed)
    assert ctl.log == [("set", 1200), ("set", 1210), ("reset",)]
    assert "iteration 0" in hook.mismatch  # the first mismatch is kept


@pytest.mark.parametrize("cut, message", [(-1, "only 7 of the plan's 8"), (None, "after all 7 planned")])
def test_plan_length_mismatch(cut, message):
    order = deepspeed_order(1, 2, 4)
    if cut == -1:  # plan longer than what runs
        plan, executed = plan_for(order), order[:-1]
    else:  # plan shorter than what runs
        plan, executed = plan_for(order[:-1]), order
    hook = FrequencyHook(plan, Recorder(), stage=1)
    run_sequence(hook, executed)
    assert not hook.ok and message in hook.mismatch


def test_no_plan_times_and_charges_energy_at_the_default_clock():
    class Dvfs:
        def time_ratio(self, mhz):
            return 1.0

        def power_w(self, mhz):
            return mhz / 100.0

        def blocking_power_w(self):
            return 1.0

    energy = ModelledEnergy(Dvfs())
    ticks = iter(range(100))
    hook = FrequencyHook(None, FrequencyController(), energy, default_mhz=3000, clock=lambda: float(next(ticks)))
    hook.run("forward", lambda: None)  # 1 tick = 1 s at 30 W
    hook.run("backward", lambda: None)
    assert hook.end_iteration()[1].seconds == 1.0
    assert energy.finish_iteration(5.0) == pytest.approx(60.0 + 3.0)


class _Cmd:
    pass


def test_install_wraps_the_instance_map_that_deepspeeds_exec_schedule_runs():
    """Run DeepSpeed's own ``_exec_schedule`` (MethodType over ``self._INSTRUCTION_MAP``) with the real
    TrainSchedule on a stand-in engine: the hook sees every forward/backward in 1F1B order, applies the plan through
    an emulate controller and leaves the class map untouched."""
    from deepspeed.runtime.pipe import schedule
    from deepspeed.runtime.pipe.engine import PipelineEngine

    executed = []

    def op(name):
        def f(self, **kw):
            executed.append((name, kw.get("buffer_id")))
        return f

    class StandIn:
        _INSTRUCTION_MAP: ClassVar[dict] = {cls: op(cls.__name__) for cls in (
            schedule.OptimizerStep, schedule.ReduceGrads, schedule.ReduceTiedGrads, schedule.LoadMicroBatch,
            schedule.ForwardPass, schedule.BackwardPass, schedule.SendActivation, schedule.RecvActivation,
            schedule.SendGrad, schedule.RecvGrad)}

        def _reserve_pipe_buffers(self, n):
            pass

    class Ratio2:
        def time_ratio(self, mhz):
            return 1.0 if mhz >= 2000 else 1.25

        def power_w(self, mhz):
            return 1.0

        def blocking_power_w(self):
            return 0.0

    class_map = dict(StandIn._INSTRUCTION_MAP)
    engine = StandIn()
    order = deepspeed_order(0, 2, 4)
    ctl = EmulateController(Ratio2())
    hook = FrequencyHook(plan_for(order, 1000, 2000), ctl, default_mhz=2000)
    hook.install(engine)
    for _ in range(2):
        PipelineEngine._exec_schedule(engine, schedule.TrainSchedule(micro_batches=4, stages=2, stage_id=0))
        records = hook.end_iteration()
        assert [(r.instruction, r.microbatch) for r in records] == order
    assert hook.ok
    assert ctl.computations == 16
    assert [r.mhz for r in records] == [s.mhz for s in plan_for(order, 1000, 2000)]
    assert class_map == StandIn._INSTRUCTION_MAP  # the class attribute is untouched
    assert sum(1 for name, _ in executed if name == "OptimizerStep") == 2  # non-computations still run
    assert sum(1 for name, _ in executed if name == "ForwardPass") == 8
