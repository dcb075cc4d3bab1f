"""Per-replica frequency plans between the plan file, the runner's job file and the worker (no processes)."""

from __future__ import annotations

import pytest

from ampe.errors import InputError
from ampe.runtime import worker
from ampe.runtime.hook import deepspeed_order
from ampe.trials.launch import job_dict
from ampe.trials.planfile import load_plan, schedule_key
from ampe.trials.prepare import prepare
from tests.support.trial_fixtures import options, strategy, write_plan


def _stages(mhz0: int, mhz1: int, gas: int = 8) -> list:
    return [[[i, m, mhz0 if s == 0 else mhz1] for i, m in deepspeed_order(s, 2, gas)] for s in range(2)]


def _entry(**fp) -> dict:
    # pp 2 × dp 1 on the 2-device cluster has one replica; the replica tests use a 1 × 2 layout below
    return strategy(1, 2, 1, 1, 0.02, frequency_plan={"stages": _stages(2000, 3000), "time_s": 0.02,
                                                      "energy_j": 1.0, **fp})


def test_plan_without_replicas_keeps_the_old_canonical_form(tmp_path):
    plan = load_plan(write_plan(tmp_path, [_entry()]))
    fp = plan.strategies[0].frequency_plan
    assert fp.replicas is None and schedule_key(fp) == _stages(2000, 3000)
    assert fp.stages[0][0] == ("forward", 0, 2000)


def test_replica_lists_are_validated_and_part_of_the_trial_key(tmp_path):
    one = [[["forward", 0, 2000], ["backward", 0, 2000]]]
    entry = strategy(1, 1, 2, 4, 0.02, frequency_plan={"stages": one, "time_s": 0.02, "energy_j": 1.0,
                                                       "replicas": [{"stages": one}, {"stages": [[
                                                           ["forward", 0, 1500], ["backward", 0, 1500]]]}]})
    plan = load_plan(write_plan(tmp_path, [entry]))
    fp = plan.strategies[0].frequency_plan
    assert fp.replicas is not None and fp.replicas[1].stages[0][0] == ("forward", 0, 1500)
    assert schedule_key(fp)["replicas"][1][0][1] == ["backward", 0, 1500]
    ctx, trials, _ = prepare(write_plan(tmp_path, [entry]), options(tmp_path / "out", freq_backend="emulate"))
    sched = next(t for t in trials if t.schedule is not None)
    job = job_dict(ctx, sched, tmp_path / "job")
    assert job["frequency_plan"]["replicas"][1]["stages"][0][0] == ["forward", 0, 1500]
    # the worker picks its replica's lists
    parsed = worker.parse_job(job, tmp_path / "job" / "job.json").frequency_plan
    assert parsed is not None and parsed.check_shape(1, 2) is None
    for replica, mhz in ((0, 2000), (1, 1500)):
        assert parsed.replica_stages(replica)[0][0][2] == mhz
    same = parsed.model_copy(update={"replicas": None})
    assert same.replica_stages(1) == parsed.stages
    short = parsed.model_copy(update={"replicas": parsed.replicas[:1]})
    assert "replicas" in short.check_shape(1, 2)


def test_replica_plan_indexes_the_distinct_lists(tmp_path):
    fast = [[["forward", 0, 2000], ["backward", 0, 2000]]]
    slow = [[["forward", 0, 1500], ["backward", 0, 1500]]]
    fp = {"stages": fast, "time_s": 0.02, "energy_j": 1.0, "replicas": [{"stages": slow}, {"stages": fast}],
          "replica_plan": [1, 1]}
    plan = load_plan(write_plan(tmp_path, [strategy(1, 1, 2, 4, 0.02, frequency_plan=fp)]))
    parsed = plan.strategies[0].frequency_plan
    assert parsed is not None and parsed.check_shape(1, 2) is None
    assert [parsed.replica_stages(r)[0][0][2] for r in range(2)] == [2000, 2000]
    assert schedule_key(parsed)["replica_plan"] == [1, 1]  # another assignment is another schedule
    assert "replica_plan" in parsed.check_shape(1, 3)  # two entries for three replicas
    stale = write_plan(tmp_path, [strategy(1, 1, 2, 4, 0.02, frequency_plan={**fp, "stages": slow})])
    with pytest.raises(InputError) as e:  # `stages` (the trial key) must be what replica 0 runs: entry 1 here
        load_plan(stale)
    assert e.value.field == "strategies[0].frequency_plan.stages" and "replicas[1]" in e.value.message


@pytest.mark.parametrize("fp,field", [
    ({"stages": [[["forward", 0, 2000]]]}, "strategies[0].frequency_plan.stages"),  # one list for 2 stages
    ({"stages": [[["forward", 0, 2000]], []]}, "strategies[0].frequency_plan.stages[1]"),
    ({"stages": [[["forward", 0, 2000]], [["forward", 0, "max"]]]}, "strategies[0].frequency_plan.stages[1][0][2]"),
    ({"stages": [[["forward", 0, 2000]], [["forward", 0, 10 ** 9]]]}, "strategies[0].frequency_plan.stages[1][0][2]"),
    ({"stages": [[["forward", 0, 2000]], [["forward", True, 1000]]]}, "strategies[0].frequency_plan.stages[1][0][1]"),
    ({"stages": _stages(1, 1), "replicas": [{"stages": _stages(1, 1)}, {"stages": _stages(1, 1)}]},
     "strategies[0].frequency_plan.replicas"),  # dp is 1
    ({"stages": _stages(1, 1), "replicas": ["x"]}, "strategies[0].frequency_plan.replicas[0]"),
    ({"stages": _stages(1, 1), "replicas": [{"stages": _stages(1, 1)}], "replica_plan": [1]},
     "strategies[0].frequency_plan.replica_plan[0]"),  # no entry 1
    ({"stages": _stages(1, 1), "replica_plan": [0]}, "strategies[0].frequency_plan.replica_plan"),  # no replicas
    ({"stages": _stages(1, 1), "replicas": [{"stages": [[["forward", 0, 5]], [["sideways", 0, 5]]]}]},
     "strategies[0].frequency_plan.replicas[0].stages[1][0][0]"),
])
def test_bad_frequency_plans_name_the_field(tmp_path, fp, field):
    entry = strategy(1, 2, 1, 1, 0.02, frequency_plan=fp)
    with pytest.raises(InputError) as e:
        load_plan(write_plan(tmp_path, [entry]))
    assert e.value.field == field


def test_hook_alternates_with_and_without_the_plan():
    from ampe.measure.freq import FrequencyController
    from ampe.runtime.hook import FrequencyHook, PlannedStep

    class Recorder(FrequencyController):
        def __init__(self):
            super().__init__()
            self.log = []

        def set_mhz(self, mhz):
            super().set_mhz(mhz)
            self.log.append(mhz)

        def reset(self):
            super().reset()
            self.log.append("reset")

    order = deepspeed_order(0, 2, 4)
    ctl = Recorder()
    hook = FrequencyHook([PlannedStep(i, m, 1500) for i, m in order], ctl, default_mhz=3000)
    clocks = []
    for it in range(4):
        hook.set_enabled(it % 2 == 1)
        for i, _ in order:
            hook.run(i, lambda: None)
        clocks.append({r.mhz for r in hook.end_iteration()})
    assert clocks == [{3000}, {1500}, {3000}, {1500}]  # the plan only on odd iterations, default clock otherwise
    assert hook.ok and ctl.log.count("reset") == 2 and ctl.log.count(1500) == 2 * len(order)


def test_job_alternate_schedule_flag(tmp_path):
    base = {"schema": "ampe.job/1", "model": "gpt2-tiny", "strategy": {"pp": 2, "dp": 1, "tp": 1, "mbs": 1,
                                                                      "gbs": 8}}
    assert worker.parse_job(base, tmp_path / "job.json").alternate_schedule is False
    assert worker.parse_job({**base, "alternate_schedule": True}, tmp_path / "job.json").alternate_schedule
    with pytest.raises(InputError, match="alternate_schedule"):
        worker.parse_job({**base, "alternate_schedule": "yes"}, tmp_path / "job.json")


def test_a_frequency_plan_must_be_one_iteration_of_the_strategy():
    from ampe.formats.frequency_plan import FrequencyPlan

    def plan(*stages):
        return FrequencyPlan.parse({"stages": [list(s) for s in stages]}, "plan.json")

    one = [["forward", m, 1500] for m in range(2)] + [["backward", m, 1500] for m in range(2)]
    assert plan(one, one).check_shape(2, 1, gas=2) is None
    assert plan(one, one).check_shape(2, 1) is None  # without gas only the shape is checked
    twice = one + one  # interleaved, 2 virtual stages: every micro-batch once per chunk
    assert plan(twice, twice).check_shape(2, 1, gas=2, virtual_stages=2) is None
    doubled = plan(twice, one).check_shape(2, 1, gas=2)  # twice the steps of one iteration
    assert doubled == "stages[0]: needs the forward of every micro-batch 0..1 once; micro-batch 0 has 2"
    beyond = [*one[:-1], ["backward", 99, 1500]]
    assert plan(one, beyond).check_shape(2, 1, gas=2) == ("stages[1]: backward of micro-batch 99, but the strategy "
                                                          "runs 2 micro-batches per iteration (0..1)")
    missing = [step for step in one if step[1] != 1 or step[0] == "backward"]
    assert "forward of every micro-batch 0..1 once; micro-batch 1 has 0" in plan(one, missing).check_shape(2, 1, 2)
    assert "times (once per virtual stage)" in plan(one, one).check_shape(2, 1, gas=2, virtual_stages=2)
