"""The frozen request of ``plan_clocks`` (ampe/energy/clock_request.py): its fields are the call's knobs, its
checks refuse what the planner cannot do, and a knob set through it (``fold_from``, ``py_max_entries``) reaches the LP
or the min cut."""

from __future__ import annotations

import pytest

from ampe.energy.clock_request import ClockRequest, FrontierKey
from ampe.energy.strategy import FrontierCache, plan_clocks
from tests.energy.energy_support import het_strategy


@pytest.fixture(scope="module")
def het():
    return het_strategy()


def _points(se):
    return [(p.time_s, p.energy_j) for r in se.replicas for p in r.frontier.points]


def test_keywords_are_shorthand_for_the_request(het):
    cl, est = het
    by_request = plan_clocks(est, cl, ClockRequest(straggler=1.1, margin=0.02))
    by_keywords = plan_clocks(est, cl, straggler=1.1, margin=0.02)
    over = plan_clocks(est, cl, ClockRequest(straggler=1.5), straggler=1.1, margin=0.02)  # keywords win
    assert _points(by_request) == _points(by_keywords) == _points(over)
    assert by_request.straggler == 1.1 and by_request.margin == 0.02


@pytest.mark.parametrize(("fields", "words"), [
    ({"planner": "fastest"}, "unknown energy planner"),
    ({"straggler": 0.9}, "straggler factor must be ≥ 1"),
    ({"straggler": float("nan")}, "straggler factor must be ≥ 1"),
    ({"margin": 1.5}, "margin 0..1"),
    ({"coarsening": 0.5}, "coarsening must be"),
    ({"traced": False, "screen": True}, "traced=False needs"),  # screening solves no direct points
    ({"traced": False, "fastest_only": True}, "traced=False needs"),
    ({"traced": False, "planner": "envpipe"}, "traced=False needs"),
])
def test_a_request_the_planner_cannot_do_is_refused(fields, words):
    with pytest.raises(ValueError, match=words):
        ClockRequest(**fields)


def test_the_request_is_frozen_and_hashable_weights_included():
    a = ClockRequest(weights=[[1.0, 2.0], [3.0, 4.0]])  # type: ignore[arg-type]  # a list, as a caller may give
    b = ClockRequest(weights=((1.0, 2.0), (3.0, 4.0)))
    assert a == b and hash(a) == hash(b) and a.weights == ((1.0, 2.0), (3.0, 4.0))
    with pytest.raises(AttributeError):
        a.screen = True  # type: ignore[misc]


def test_fold_from_and_traced_are_part_of_the_frontier_key(het):
    """The same strategy with another fold threshold is another question: traced again, not read from the cache."""
    cl, est = het
    cache = FrontierCache()
    plan_clocks(est, cl, ClockRequest(fastest_only=True), cache=cache)
    first = cache.traced
    plan_clocks(est, cl, ClockRequest(fastest_only=True), cache=cache)
    assert cache.traced == first  # the same request: every replica from the cache
    plan_clocks(est, cl, ClockRequest(fastest_only=True, fold_from=0), cache=cache)
    assert cache.traced == 2 * first
    assert all(isinstance(k, FrontierKey) for k in cache.entries)
    assert {k.fold_from for k in cache.entries} == {ClockRequest().fold_from, 0}
    plan_clocks(est, cl, ClockRequest(traced=False), cache=cache)  # so is an untraced one
    assert cache.traced == 3 * first and {k.traced for k in cache.entries} == {True, False}


def test_py_max_entries_reaches_the_min_cut_and_leaves_the_frontier_alone(het, monkeypatch):
    """Every network to scipy (0) or to the Python Dinic (huge): the request's knob reaches each min cut, and the
    frontiers are the same (the source-minimal min cut is unique)."""
    from ampe.tradeoff import mincut

    cl, est = het
    seen: list[bool] = []
    real = mincut._Arcs.__init__

    def spy(self, *args, **kw):  # observes which max flow each network got; the knob is set through the request
        real(self, *args, **kw)
        seen.append(self.python)

    monkeypatch.setattr(mincut._Arcs, "__init__", spy)
    scipy_only = plan_clocks(est, cl, ClockRequest(py_max_entries=0))
    assert seen and not any(seen)
    seen.clear()
    python_only = plan_clocks(est, cl, ClockRequest(py_max_entries=1 << 30))
    assert seen and all(seen)
    assert _points(scipy_only) == _points(python_only)
