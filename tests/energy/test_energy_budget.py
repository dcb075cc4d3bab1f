"""Energy planning estimates its work before it starts (ampe.energy.budget): the estimate follows what the planner
builds and traces, a search over the bound is planned with a coarser τ and says so in one line, far over it is
refused naming the flag, and the search shows its progress on stderr."""

from __future__ import annotations

import itertools
import json
import logging

import pytest

from ampe.costmodel.catalog import CATALOG
from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.zoo import load_model
from ampe.energy import budget
from ampe.energy.inputs import PipelineInputs, dag_from_inputs, job_of, replica_inputs
from ampe.energy.ranking import rank_strategies
from ampe.energy.strategy import RESOLUTION, FrontierCache, replica_dag
from ampe.errors import InputError
from ampe.search.engine import SearchOptions, search
from ampe.tradeoff.evaluate import evaluate_choice, fastest_choice
from ampe.tradeoff.frontier import trace_frontier
from tests.conftest import SPECS

_DECIDE = budget.decide


@pytest.fixture(scope="module")
def tiny():
    cl = load_cluster(SPECS / "local-cpu.yaml")
    res = search(cl, load_model("gpt2-tiny"), None, SearchOptions(gbs=8))
    return cl, [c.estimate for c in res.ranked]


def test_the_node_count_is_the_dag_the_planner_builds(tiny):
    cl, ests = tiny
    for i, est in enumerate(ests):
        cache = FrontierCache()  # identical replicas share one DAG object: count the distinct ones
        dags = {id(d): d for d in (replica_dag(x, cache).dag for x in replica_inputs(est, cl))}
        job = job_of(i, est, cl)
        assert job.nodes == sum(len(d.nodes) for d in dags.values()), job.label
    assert budget.dag_nodes(32, 768) == 96_768  # GPT-3 175B's 32 × 768 (docs/energy.md §8)
    assert budget.dag_nodes(4, 8, transfers=False) == 64 and budget.dag_nodes(4, 8) == 64 + 48


@pytest.mark.parametrize("gpu", ["V100-16GB", "A100-80GB", "T4", "cpu"])
def test_the_expected_steps_bound_what_pd_traces(gpu):
    g = CATALOG[gpu]
    dag = dag_from_inputs(PipelineInputs((0.01,) * 4, (0.02,) * 4, (g,) * 4, 8, p2p_forward_s=(0.001,) * 3))
    ratio = budget.slowdown_ratio(g)
    t_min = evaluate_choice(dag, fastest_choice(dag)).time_s
    traced = trace_frontier(dag, t_min / 200)
    steps = traced.trace.t_star - traced.trace.t_min
    expected = budget.frontier_steps(ratio, 200)
    assert 0.5 * expected <= steps <= expected, (steps, expected)  # an upper bound, not a wild one


def test_the_bounds_decide_coarsening_and_refusal():
    small = budget.Work(fixed=1e6, frontier=1e8, strategies=3)
    assert budget.decide(small, "--max-slowdown", "3 strategies", False).coarsening == 1.0
    over = budget.Work(fixed=1e6, frontier=4 * budget.FRONTIER_BOUND, strategies=3)
    d = budget.decide(over, "--max-slowdown", "3 strategies", False)
    assert d.coarsening == 4.0 and d.work.at(d.coarsening) <= budget.FRONTIER_BOUND + 1e6
    assert d.note is not None and "4× coarser unit time" in d.note and "T_min/250" in d.note
    with pytest.raises(InputError, match="over the bound even with a 10× coarser") as e:
        budget.decide(budget.Work(1e6, 11 * budget.FRONTIER_BOUND, 300), "--max-slowdown", "300 strategies", False)
    assert e.value.source == "--max-slowdown"
    with pytest.raises(InputError) as e:  # τ given by the user is never changed
        budget.decide(over, "--max-slowdown", "3 strategies", True)
    assert e.value.source == "--unit-time"
    with pytest.raises(InputError, match="--energy-planner none"):
        budget.decide(budget.Work(2 * budget.TOTAL_BOUND, 0.0, 30), "--top-k", "the top 30", False)


def test_a_trace_is_cheap_below_a_cpu_second_of_its_estimate(tiny):
    """The priced objectives' default path (budget.trace_is_cheap): tiny strategies keep their traces; the fastest
    strategy at 1,024 GPUs (benchmarks/objective_speed.py: Llama-3.1-405B, pp 16, 128 micro-batches, 3 distinct
    replica DAGs, A100's ρ, τ 7.9× coarser) does not; a coarser τ makes a trace cheaper, a τ given is kept."""
    cl, ests = tiny
    assert all(budget.trace_is_cheap(job_of(i, est, cl), None) for i, est in enumerate(ests))
    ratio = budget.slowdown_ratio(CATALOG["A100-80GB"])
    big = budget.Job(0, 3 * budget.dag_nodes(16, 128), ratio, 81, 53.4, "pp16, 128 micro-batches")
    trace = budget.frontier_work(big, "perseus", RESOLUTION, None)[1]
    assert not budget.trace_is_cheap(big, None, 7.9, RESOLUTION)
    k = trace / budget.EXACT_TRACE_STEPS * 1.01  # just coarse enough
    assert budget.trace_is_cheap(big, None, k, RESOLUTION) and not budget.trace_is_cheap(big, None, k / 1.02)
    tau = big.t_min_s / RESOLUTION * k  # the same τ, given: the coarsening does not apply again
    assert budget.trace_is_cheap(big, tau, 100.0) and not budget.trace_is_cheap(big, tau / 1.02, 100.0)


def _bound_below_the_estimate(monkeypatch, times: float) -> list[budget.Work]:
    """Decide the next searches (the CLI's, which take no bound) with a frontier bound ``times`` below whatever each
    estimates; returns the estimates seen."""
    seen: list[budget.Work] = []
    real = _DECIDE

    def lowered(work: budget.Work, flag: str, what: str, user_unit: bool,
                frontier_bound: float = budget.FRONTIER_BOUND) -> budget.Decision:
        seen.append(work)
        return real(work, flag, what, user_unit, work.frontier / times)

    monkeypatch.setattr(budget, "decide", lowered)
    return seen


def test_a_search_over_the_bound_is_coarsened_and_says_so(tiny, monkeypatch, caplog):
    cl, ests = tiny
    estimates: list[budget.Work] = []

    def observed(*args, **kw) -> budget.Decision:  # only records the estimate the plain search is decided on
        estimates.append(args[0])
        return _DECIDE(*args, **kw)

    monkeypatch.setattr(budget, "decide", observed)
    plain = rank_strategies(ests, cl, objective="energy", max_slowdown=0.2, top_k=3)
    monkeypatch.setattr(budget, "decide", _DECIDE)
    assert plain.coarsening == 1.0 and plain.note is None and len(estimates) == 1
    assert all(r.energy.unit_s == pytest.approx(r.energy.t_min_s / RESOLUTION) for r in plain.ranked)
    frontier = estimates[0].frontier
    seen: list[tuple[float, float]] = []
    with caplog.at_level(logging.INFO, logger="ampe.energy.ranking"):  # the same search, its bound 4× below
        ranked = rank_strategies(ests, cl, objective="energy", max_slowdown=0.2, top_k=3,
                                 progress=lambda d, t: seen.append((d, t)), frontier_bound=frontier / 4)
    said = [r.getMessage() for r in caplog.records if r.name == "ampe.energy.ranking"]  # logged, for the CLI
    assert ranked.coarsening == 4.0 and said == [ranked.note]
    assert "4× coarser unit time (τ = T_min/250 instead of T_min/1000" in said[0]
    for r in ranked.ranked:  # every frontier planned at the coarser τ
        assert r.energy.unit_s == pytest.approx(4 * r.energy.t_min_s / RESOLUTION)
    assert seen and seen[-1][0] == seen[-1][1]  # progress ends full, never goes back
    assert all(a[0] <= b[0] for a, b in itertools.pairwise(seen))
    with pytest.raises(InputError, match="within 20 % of the fastest") as e:  # beyond 10× coarser: refused
        rank_strategies(ests, cl, objective="energy", max_slowdown=0.2, top_k=3, frontier_bound=frontier / 20)
    assert e.value.source == "--max-slowdown"


def test_search_prints_the_coarsening_and_plain_progress(run_cli, tmp_path, monkeypatch):
    from ampe.cli import _progress

    monkeypatch.setattr(_progress, "PLAIN_AFTER_S", 0.0)
    _bound_below_the_estimate(monkeypatch, 2.0)
    out = tmp_path / "plan.json"
    code, _, err = run_cli("search", "--cluster", SPECS / "local-cpu.yaml", "--model", "gpt2-tiny", "--objective",
                           "energy", "--max-slowdown", "10%", "--top-k", "3", "--out", out)
    assert code == 0, err
    lines = err.splitlines()
    assert any(line.startswith("ampe search: energy planning: ") and "2× coarser unit time" in line for line in lines)
    assert any(line.startswith("ampe search: searching ") and "candidate groups" in line for line in lines)
    assert any(line.startswith("ampe search: energy planning 100%") for line in lines)
    assert json.loads(out.read_text())["search"]["energy"]["coarsening"] == 2.0


def test_evaluate_refuses_more_strategies_than_it_costs_and_shows_progress(run_cli, tmp_path, monkeypatch):
    from ampe.cli import _progress, evaluate

    monkeypatch.setattr(_progress, "PLAIN_AFTER_S", 0.0)
    one = {"pp": 2, "dp": 1, "tp": 1, "mbs": 1, "gbs": 8}
    many = tmp_path / "many.json"
    many.write_text(json.dumps([one] * (evaluate.MAX_STRATEGIES + 1)))
    code, _, err = run_cli("evaluate", "--cluster", SPECS / "local-cpu.yaml", "--model", "gpt2-tiny", "--strategy",
                           many)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"{evaluate.MAX_STRATEGIES + 1} strategies; evaluate costs at most {evaluate.MAX_STRATEGIES}" in err
    two = tmp_path / "two.json"
    two.write_text(json.dumps([one, one]))
    code, _, err = run_cli("evaluate", "--cluster", SPECS / "local-cpu.yaml", "--model", "gpt2-tiny", "--strategy",
                           two)
    assert code == 0 and "ampe evaluate: costing 2/2 strategies" in err


def test_progress_on_a_terminal_draws_a_bar_of_counts_or_a_percentage(capsys):
    from ampe.cli._progress import PhaseProgress

    for unit in ("candidate groups", None):
        with PhaseProgress("ampe search", "phase", unit, tty=True) as p:
            for done in range(4):
                p.update(done, 3.0)
        assert "Traceback" not in capsys.readouterr().err
    first = PhaseProgress("ampe search", "searching", tty=True)
    first.update(1, 2)
    first.close()  # the next phase's bar may start now (a terminal shows one live bar at a time)
    first.update(2, 2)  # after close: ignored
    with PhaseProgress("ampe search", "energy planning", tty=True) as second:
        second.update(1, 1)
