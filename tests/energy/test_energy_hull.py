"""Quantization, Pareto staircase and convex hull of one computation's options (property tests)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from ampe.tradeoff.hull import lower_hull, quantized_times, staircase

# Subnormal costs are left out: two options 5e-324 J apart give a slope that underflows to 0, a difference no meter
# or model produces (Hypothesis found it once; it is not a property of the hull).
options = st.lists(st.tuples(st.floats(0.001, 0.2), st.floats(-50.0, 50.0, allow_subnormal=False)), min_size=1,
                   max_size=25)


@settings(max_examples=200, deadline=None)
@given(options, st.sampled_from([0.0005, 0.001, 0.004]))
def test_staircase_and_hull_properties(opts, unit):
    times, costs = [t for t, _ in opts], [c for _, c in opts]
    stairs = staircase(times, costs, unit)
    q = quantized_times(times, unit)
    assert all(a < b for a, b in zip(stairs.q, stairs.q[1:], strict=False))  # slower …
    assert all(a > b for a, b in zip(stairs.cost, stairs.cost[1:], strict=False))  # … and strictly cheaper
    assert stairs.cost[-1] == min(costs)  # the cheapest option is the slowest kept
    assert stairs.q[0] == min(q) and stairs.cost[0] == min(c for c, x in zip(costs, q, strict=False) if x == min(q))
    for i in range(len(times)):  # every option is dominated by (or is) a staircase option
        k = stairs.pick(q[i])
        assert stairs.q[k] <= q[i] and stairs.cost[k] <= costs[i]
    hull = lower_hull(stairs)
    assert hull.q[0] == stairs.q[0] and hull.q[-1] == stairs.q[-1]
    slopes = [hull.slope(j) for j in range(len(hull.q) - 1)]
    assert all(s > 0 for s in slopes) and all(a >= b - 1e-9 for a, b in itertools.pairwise(slopes))  # convex
    for x, c in zip(stairs.q, stairs.cost, strict=False):  # below every option, through the vertices
        assert hull(x) <= c + 1e-9
    assert hull.max_gap(stairs) >= -1e-9


def test_quantization_rounds_the_fastest_time_to_nearest_and_extra_time_up():
    assert quantized_times([0.0104, 0.0111, 0.0121], 0.001) == [10, 11, 12]
    assert quantized_times([0.0106, 0.0107], 0.001) == [11, 12]
