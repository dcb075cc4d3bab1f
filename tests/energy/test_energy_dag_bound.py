"""One strategy over the energy planner's DAG bound never refuses the others (``ampe search``): it is kept out of the
ranking, listed after the planned strategies with an ``energy_not_planned`` caveat and counted in ``search.energy``.

The case: gpt2-tiny on four CPU devices, global batch 8, with the bound at 24 nodes (``PlanRequest.max_dag_nodes``,
a per-call knob). The strategies with four stages and two or more micro-batches (28, 56 and 112 nodes) and one with
two stages and eight (48) are over it; the fastest of them (pp4·mbs4, 28 nodes) is the seventh fastest of all, so
it would take a place in a top 8 — the old code refused the whole plan for it. Found at scale with Llama-3.1-405B
on 256 GPUs of three types (a pp64·dp1·tp4 strategy with 1024 micro-batches: 260,096 nodes of 200,000)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.zoo import load_model
from ampe.energy import ranking
from ampe.energy.inputs import job_of
from ampe.errors import InputError
from ampe.planning import PlanRequest, make_plan
from ampe.search.engine import SearchOptions, search
from ampe.trials.planfile import plan_from_dict
from tests.conftest import SPECS

BOUND = 24


@pytest.fixture(scope="module")
def case():
    cluster, model = load_cluster(SPECS / "local-cpu-4.yaml"), load_model("gpt2-tiny")
    return cluster, model, SearchOptions(gbs=8, top_k=8, local_search=0)


def _plan(case, **knobs):
    cluster, model, opts = case
    return make_plan(cluster, model, None, PlanRequest(search=opts, **knobs))


def test_the_old_refusal_is_what_rank_strategies_still_does(case):
    """rank_strategies itself still refuses a strategy over the bound among those it would visit (its other callers
    rank a set they chose), before building that strategy's DAG."""
    cluster, model, opts = case
    ests = [c.estimate for c in search(cluster, model, None, opts).ranked]
    nodes = [job_of(i, e, cluster).nodes for i, e in enumerate(ests)]
    assert nodes[:8].count(28) == 1 and max(nodes[:8]) == 28 and max(nodes[:6]) <= BOUND  # the 7th is over it
    with pytest.raises(InputError, match=f"28 nodes \\(at most {BOUND};"):
        ranking.rank_strategies(ests, cluster, top_k=8, max_dag_nodes=BOUND)


def test_the_fastest_strategy_over_the_bound_is_refused_before_its_dag_is_built(case, monkeypatch):
    cluster, model, opts = case
    ests = [c.estimate for c in search(cluster, model, None, opts).ranked]
    nodes = [job_of(i, e, cluster).nodes for i, e in enumerate(ests)]
    big = next(i for i, n in enumerate(nodes) if n > BOUND)  # the fastest over the bound (28 nodes)
    slower = [e for e, n in zip(ests[big + 1:], nodes[big + 1:], strict=True) if n <= BOUND][:3]
    built = []
    real = ranking.fastest_time_s
    monkeypatch.setattr(ranking, "fastest_time_s", lambda e, *a, **k: built.append(e) or real(e, *a, **k))
    with pytest.raises(InputError, match="28 nodes"):
        ranking.rank_strategies([*slower, ests[big]], cluster, top_k=2, max_dag_nodes=BOUND)
    assert built == []


@pytest.mark.parametrize("objective", ["time", "energy"])
def test_a_strategy_over_the_bound_is_listed_unplanned_and_the_others_are_planned_as_without_it(case, objective):
    knobs = {"objective": objective, "max_slowdown": 0.25} if objective == "energy" else {}
    made = _plan(case, max_dag_nodes=BOUND, **knobs)
    entries = made.plan.strategies
    planned = [e for e in entries if e.predicted.energy_j is not None]
    unplanned = entries[len(planned):]
    assert len(planned) == 8 and unplanned  # every planned one first
    assert all(not e.caveats and e.pp < 4 for e in planned)
    assert all([c.kind for c in e.caveats] == ["energy_not_planned"] and e.frequency_plan is None
               and e.predicted.plan_time_s is None and e.pp == 4 for e in unplanned)
    assert [e.rank for e in entries] == list(range(1, len(entries) + 1))
    # fastest first, each one that could have taken a place: within the bound or the slowest planned entry's time
    times = [e.predicted.iteration_s for e in unplanned]
    assert times == sorted(times)
    limit = max([made.energy.bound_s or 0.0] + [e.predicted.plan_time_s for e in planned])
    assert all(t <= limit for t in times)
    note = unplanned[0].caveats[0].note
    assert f"has 28 nodes (4 stages × 2 micro-batches), over the planner's bound of {BOUND}" in note
    assert "--energy-planner none" in note and "--pp" in note
    stats = made.plan.search.energy
    # 28, 56, 112 and 48 nodes (the energy objective's variants are made of the others only)
    assert stats is not None and stats.unplanned == 4
    assert stats.max_dag_nodes == BOUND
    # the planned entries are those of a run where the four-stage strategies are absent
    without = _plan(case, pipeline_degrees=(1, 2), **knobs)
    assert [e.model_dump() for e in without.plan.strategies] == [e.model_dump() for e in planned]
    stats_without = without.plan.search.energy
    assert stats_without is not None and "unplanned" not in stats_without.model_dump(exclude_unset=True)
    # what `ampe trial` and `ampe export` read: the entry, its caveat, no frequency plan
    doc = plan_from_dict(made.plan.to_json(), "plan.json")
    assert [s.caveats[0].kind for s in doc.strategies[len(planned):]] == ["energy_not_planned"] * len(unplanned)
    assert all(s.frequency_plan is None for s in doc.strategies[len(planned):])


def test_the_search_table_shows_the_unplanned_strategy(case, capsys):
    from ampe.cli.search import _print, _print_unplanned

    cluster, model, _ = case
    made = _plan(case, max_dag_nodes=BOUND)
    _print(cluster, model, made.search, made.plan.strategies, made.energy, len(made.kept))
    _print_unplanned(made.plan)
    out = capsys.readouterr().out
    assert "rank 9: energy not planned (ranked after every planned strategy): its energy-planning DAG" in out
    assert "not planned" in out.split("energy per iteration")[1]
    assert f"4 strategies have an energy DAG over the planner's bound of {BOUND} nodes and were not planned" in out
    assert "rank 9 of this plan, after every planned one" in out


def test_every_strategy_over_the_bound_is_the_old_refusal(case):
    with pytest.raises(InputError, match=r"energy planning: .* nodes \(at most 1;"):
        _plan(case, max_dag_nodes=1)


def test_the_fastest_strategy_over_the_bound_leaves_the_energy_ranking_as_without_it(case):
    """At 5 nodes every pipelined strategy is over the bound (the fastest of all among them: pp2, one micro-batch,
    6 nodes) and so are those of pp 1 with four or more micro-batches: the slowdown bound and the variants are those
    of the strategies planned, so the plan's planned part is that of a search of pp 1 alone."""
    knobs = {"objective": "energy", "max_slowdown": 0.25, "max_dag_nodes": 5}
    made, without = _plan(case, **knobs), _plan(case, pipeline_degrees=(1,), **knobs)
    assert made.energy is not None and without.energy is not None and made.energy.bound_s == without.energy.bound_s

    def planned(m):
        return [e.model_dump() for e in m.plan.strategies if e.predicted.energy_j is not None]

    assert planned(made) == planned(without) and len(planned(made)) >= 4
    unplanned = made.plan.strategies[len(planned(made)):]
    fastest = min(c.estimate.iteration_s for c in made.search.ranked)
    assert unplanned[0].predicted.iteration_s == fastest and unplanned[0].pp == 2
    assert len(unplanned) <= 8 and all(e.caveats[-1].kind == "energy_not_planned" for e in unplanned)


def test_the_strategies_plot_draws_only_the_planned_entries_each_at_its_own_point(case, monkeypatch, tmp_path):
    """Under an energy objective the ranking holds more strategies than the plan lists; the plot pairs each planned
    entry with its own ranked point and draws no unplanned one (it has none)."""
    import argparse

    import ampe.viz
    from ampe.cli.search import _pictures

    cluster, model, opts = case
    made = make_plan(cluster, model, None, PlanRequest(search=replace(opts, top_k=3), max_dag_nodes=BOUND,
                                                       objective="energy", max_slowdown=0.3))
    assert made.energy is not None and len(made.energy.ranked) > 3  # more ranked than the plan's top k
    drawn = []
    monkeypatch.setattr(ampe.viz, "strategies_plot", lambda path, marks, *a, **k: drawn.extend(marks))
    _pictures(argparse.Namespace(plot=tmp_path / "s.png", timeline=None, top_k=3, energy_planner="perseus"),
              made.energy, made.plan.strategies)
    planned = [e for e in made.plan.strategies if not any(c.kind == "energy_not_planned" for c in e.caveats)]
    assert len(drawn) == len(planned) < len(made.plan.strategies)
    for mark, entry in zip(drawn, planned, strict=True):
        assert mark.label.startswith(f"#{entry.rank} ")
        assert mark.time_s == pytest.approx(entry.predicted.plan_time_s)
