"""Eq. 5 against the schedule simulation, and schedule orders against DeepSpeed's TrainSchedule."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ampe.costmodel.pipeline import eq5, simulate
from ampe.costmodel.schedules import schedule_order


@settings(max_examples=200, deadline=None)
@given(pp=st.integers(1, 8), gas=st.integers(1, 16), f=st.floats(0.01, 5), ratio=st.floats(0.5, 3))
def test_eq5_equals_simulation_for_uniform_stages_without_communication(pp, gas, f, ratio):
    fwd = [f] * pp
    bwd = [f * ratio] * pp
    sim = simulate(fwd, bwd, [0.0] * (pp - 1), [0.0] * (pp - 1), gas).makespan_s
    assert sim == pytest.approx(eq5(np.add(fwd, bwd), [0.0] * (pp - 1), gas), rel=1e-9)
    assert sim == pytest.approx((gas + pp - 1) * f * (1 + ratio), rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), pp=st.integers(1, 6))
def test_eq5_equals_simulation_with_one_microbatch(data, pp):
    """gas = 1 is pure fill and drain: every stage and both transfers of every cut are on the path once."""
    fwd = data.draw(st.lists(st.floats(0.01, 3), min_size=pp, max_size=pp))
    bwd = data.draw(st.lists(st.floats(0.01, 3), min_size=pp, max_size=pp))
    e = data.draw(st.lists(st.floats(0, 1), min_size=pp - 1, max_size=pp - 1))
    sim = simulate(fwd, bwd, e, e, 1).makespan_s
    assert sim == pytest.approx(eq5(np.add(fwd, bwd), 2 * np.asarray(e), 1), rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), pp=st.integers(2, 6), gas=st.integers(1, 12))
def test_eq5_is_an_upper_bound_without_communication(data, pp, gas):
    """Heterogeneous stages: lighter stages partly hide behind the bottleneck, so Eq. 5 over-estimates."""
    fwd = data.draw(st.lists(st.floats(0.01, 3), min_size=pp, max_size=pp))
    bwd = [2 * x for x in fwd]
    sim = simulate(fwd, bwd, [0.0] * (pp - 1), [0.0] * (pp - 1), gas).makespan_s
    assert sim <= eq5(np.add(fwd, bwd), [0.0] * (pp - 1), gas) * (1 + 1e-9)
    assert sim >= max(np.add(fwd, bwd)) * gas * (1 - 1e-9)


def test_steady_state_round_trips_make_simulation_exceed_eq5():
    """Documented difference: with transfers and gas > pp, 1F1B's steady state waits on round trips."""
    f, b, e = [1.0] * 4, [2.0] * 4, [0.1] * 3
    assert simulate(f, b, e, e, 8).makespan_s > eq5(np.add(f, b), 2 * np.asarray(e), 8)


def _deepspeed_order(stage: int, stages: int, micro: int) -> list[str]:
    schedule = pytest.importorskip("deepspeed.runtime.pipe.schedule")
    out = []
    for cmds in schedule.TrainSchedule(micro_batches=micro, stages=stages, stage_id=stage).steps():
        for c in cmds:
            if isinstance(c, schedule.ForwardPass):
                out.append("forward")
            elif isinstance(c, schedule.BackwardPass):
                out.append("backward")
    return out


@pytest.mark.parametrize("stages,micro", [(4, 6), (2, 3), (3, 1), (4, 2), (5, 9)])
def test_1f1b_order_matches_deepspeed_train_schedule(stages, micro):
    for s in range(stages):
        ours = [op.instruction for op in schedule_order("1f1b", s, stages, micro)]
        assert ours == _deepspeed_order(s, stages, micro)


def test_1f1b_microbatch_order_matches_perseus_example():
    got = [f"{op.instruction[0].upper()}{op.microbatch}" for op in schedule_order("1f1b", 0, 4, 6)]
    assert got == ["F0", "F1", "F2", "F3", "B0", "F4", "B1", "F5", "B2", "B3", "B4", "B5"]


def test_gpipe_order_and_its_longer_fill():
    assert [op.instruction for op in schedule_order("gpipe", 1, 2, 3)] == ["forward"] * 3 + ["backward"] * 3
    uni = ([1.0] * 3, [2.0] * 3, [0.0] * 2, [0.0] * 2)
    assert simulate(*uni, 6, schedule="gpipe").makespan_s == pytest.approx(simulate(*uni, 6).makespan_s)


def test_interleaved_shrinks_the_bubble_by_the_number_of_chunks():
    pp, v, gas = 4, 2, 8
    t_f, t_b = 1.0, 2.0  # per whole device stage
    fwd = [t_f / v] * (pp * v)
    bwd = [t_b / v] * (pp * v)
    zeros = [0.0] * (pp * v - 1)
    inter = simulate(fwd, bwd, zeros, zeros, gas, "interleaved", v).makespan_s
    plain = simulate([t_f] * pp, [t_b] * pp, zeros[:pp - 1], zeros[:pp - 1], gas).makespan_s
    assert plain == pytest.approx((gas + pp - 1) * (t_f + t_b))
    assert inter == pytest.approx(gas * (t_f + t_b) + (pp - 1) * (t_f + t_b) / v)
