"""The share choice (ampe.search.shares): exact against brute force, never worse than equal shares, memory caps."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.strategy import Strategy, with_shares
from ampe.costmodel.zoo import load_model
from ampe.search.shares import fastest_shares, replicas_over, with_best_shares
from tests.conftest import SPECS


def compositions(total: int, parts: int):
    """Every tuple of ``parts`` positive integers summing to ``total``."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        yield tuple(b - a for a, b in zip((0, *cuts), (*cuts, total), strict=True))


@st.composite
def monotone_case(draw):
    """Replica classes with non-decreasing pipeline times (steps of any size, ties included), per-replica caps."""
    dp = draw(st.integers(1, 4))
    total = draw(st.integers(dp, 9))
    n_cls = draw(st.integers(1, dp))
    cls = [draw(st.integers(0, n_cls - 1)) for _ in range(dp)]
    tables = [list(itertools.accumulate(draw(st.lists(st.integers(0, 5), min_size=total, max_size=total))))
              for _ in range(n_cls)]
    caps = draw(st.one_of(st.none(), st.lists(st.integers(0, total), min_size=dp, max_size=dp)))
    return total, cls, tables, caps


@settings(max_examples=300, deadline=None)
@given(monotone_case())
def test_greedy_equals_brute_force(case) -> None:
    total, cls, tables, caps = case
    dp = len(cls)

    def pipe(c: int, g: int) -> float:
        return float(tables[c][g - 1])

    feasible = [x for x in compositions(total, dp) if caps is None or all(g <= c for g, c in zip(x, caps, strict=True))]
    got = fastest_shares(total, cls, pipe, caps)
    if not feasible:
        assert got is None
        return
    assert got is not None and sum(got) == total and min(got) >= 1
    assert caps is None or all(g <= c for g, c in zip(got, caps, strict=True))
    best = min(max(pipe(cls[r], x[r]) for r in range(dp)) for x in feasible)
    assert max(pipe(cls[r], got[r]) for r in range(dp)) == best


@settings(max_examples=300, deadline=None)
@given(monotone_case(), st.booleans())
def test_sorted_shares_are_the_greedys(case, rising: bool) -> None:
    """With the pipelines as arrays (``table``), the shares come from a threshold over the sorted values instead of
    the greedy's steps: the very same tuple, ties included (the integer tables tie often); a table that falls
    somewhere goes back to the greedy."""
    total, cls, tables, caps = case
    if not rising:
        tables = [t[::-1] for t in tables]

    def pipe(c: int, g: int) -> float:
        return float(tables[c][g - 1])

    def table(c: int, n: int) -> np.ndarray:
        return np.array([pipe(c, g) for g in range(2, n + 2)], dtype=float)

    assert fastest_shares(total, cls, pipe, caps, table) == fastest_shares(total, cls, pipe, caps)


def test_identical_replicas_get_equal_shares() -> None:
    assert fastest_shares(12, [0, 0, 0], lambda c, g: 1.5 * g + 0.25) == (4, 4, 4)


# replica 0 on two A100s (devices 0, 1), replica 1 on two A40s (16, 17), replica 2 on A100s (2, 3)
MIXED = Strategy(pp=2, dp=3, tp=1, mbs=1, gbs=12, placement=(0, 16, 2, 1, 17, 3))


@pytest.fixture(scope="module")
def cm() -> CostModel:
    return CostModel(load_cluster(SPECS / "mixed-a100-a40.yaml"), load_model("gpt3-1.3b"))


@pytest.mark.parametrize("method", ["eq5", "simulate"])
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_cost_model_shares_equal_brute_force(cm: CostModel, schedule: str, method: str) -> None:
    s = replace(MIXED, schedule=schedule, mbs=1, gbs=12)
    equal = cm.estimate(s, method)
    got = with_best_shares(cm, equal, method)
    # brute force: every share vector of the 12 micro-batches, each fully estimated, keeping those that fit as
    # well as equal shares do
    ok = [cm.estimate(with_shares(s, x), method) for x in compositions(12, 3)]
    ok = [e for e in ok if (e.fits or not equal.fits) and e.within_capacity]
    best = min(ok, key=lambda e: e.iteration_s)
    assert got.iteration_s == pytest.approx(best.iteration_s, rel=1e-12)
    assert got.iteration_s <= equal.iteration_s
    assert got.strategy.gbs == 12 and got.strategy.uneven  # the A40 replica is slower: shares pay here
    assert got.strategy.shares[1] < 4 < got.strategy.shares[0]


CAP_SPEC = """name: cap-test
nodes:
  - {name: a100, gpu: A100-40GB, count: 4, intra_gbps: 2400, inter_gbps: 200}
  - {name: a40, gpu: A40, count: 2, intra_gbps: 200, inter_gbps: 100}
"""


def test_memory_caps_the_fast_replica(tmp_path) -> None:
    # GPipe keeps every micro-batch in flight: the A100-40GB replicas (faster, smaller) cannot take a fourth one
    spec = tmp_path / "cap.yaml"
    spec.write_text(CAP_SPEC)
    cm = CostModel(load_cluster(spec), load_model("gpt3-1.3b"))
    s = Strategy(pp=2, dp=3, tp=1, mbs=1, gbs=9, placement=(0, 4, 2, 1, 5, 3), schedule="gpipe")
    equal = cm.estimate(s)
    assert equal.fits
    every = [cm.estimate(with_shares(s, x)) for x in compositions(9, 3)]
    fastest = min(every, key=lambda e: e.iteration_s)
    assert not fastest.fits and fastest.strategy.shares[0] > 3  # the unconstrained choice does not fit
    got = with_best_shares(cm, equal)
    assert got.iteration_s == pytest.approx(min(e.iteration_s for e in every if e.fits), rel=1e-12)
    assert got.fits and replicas_over(cm, got, margin=True) == []


def test_identical_replicas_keep_equal_shares(cm: CostModel) -> None:
    same = Strategy(pp=2, dp=2, tp=1, mbs=2, gbs=16, placement=(0, 2, 1, 3))  # A100s only
    equal = cm.estimate(same)
    assert with_best_shares(cm, equal) is equal


def test_interleaved_shares_are_multiples_of_the_stages(cm: CostModel) -> None:
    from ampe.costmodel.strategy import validate
    from ampe.errors import InputError

    s = replace(MIXED, schedule="interleaved", virtual_stages=2)
    equal = cm.estimate(s)
    got = with_best_shares(cm, equal)
    assert got.strategy.uneven and all(g % 2 == 0 for g in got.strategy.shares)
    even = [cm.estimate(with_shares(s, tuple(2 * u for u in x))) for x in compositions(6, 3)]
    best = min((e for e in even if (e.fits or not equal.fits) and e.within_capacity), key=lambda e: e.iteration_s)
    assert got.iteration_s == pytest.approx(best.iteration_s, rel=1e-12)
    with pytest.raises(InputError) as err:
        validate(with_shares(s, (5, 2, 5)), 24, 24)
    assert err.value.field == "replica_gas"
