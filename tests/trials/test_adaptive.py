"""Adaptive trial order (`ampe trial --budget`): the runner follows its reranker and stops when told; the calibrated
reranker orders by calibrated prediction and stops when nothing left can beat the best measured strategy."""

from __future__ import annotations

import json

import numpy as np

from ampe.formats.trial import TrialResult
from ampe.report.adaptive import calibrated_reranker
from ampe.report.calibration.measured import inputs_from_plan, measured_set, predict
from ampe.trials.planfile import load_plan
from ampe.trials.prepare import Rerank, prepare
from ampe.trials.results import ResultsStore
from ampe.trials.runner import run_trials
from tests.support.trial_fixtures import FAKE_WORKER, control, four_strategies, options, write_plan


def test_the_runner_runs_in_the_rerankers_order_and_skips_the_rest_when_it_says_stop(tmp_path):
    plan = write_plan(tmp_path, four_strategies())
    calls = []

    def rerank(plan, cluster, results, pending):
        calls.append([t.key for t in pending])
        if len(calls) == 2:
            return Rerank(tuple(t.key for t in pending), "enough")
        return Rerank(tuple(reversed([t.key for t in pending])))

    out = tmp_path / "out"
    env = control(iter_s=0.005)
    results = run_trials(plan, options(out, env=env, rerank=rerank))
    ran = [r for r in ResultsStore(out).latest().values()]
    assert [r.plan_rank for r in sorted(ran, key=lambda r: r.started_at)] == [1, 4]  # plan rank 1, then reversed
    skipped = {r.plan_rank: r.reason for r in results if r.status == "skipped"}
    assert set(skipped) == {2, 3} and all(v == "adaptive: enough" for v in skipped.values())
    assert len(calls) == 2 and len(calls[0]) == 3 and len(calls[1]) == 2


def _result(entry: dict, measured: float) -> TrialResult:
    s = {k: entry[k] for k in ("pp", "dp", "tp", "mbs", "gbs", "gas", "partition", "placement", "schedule")}
    return TrialResult(key=f"k{entry['rank']}", trial_id=f"r{entry['rank']}", plan_rank=entry["rank"], strategy=s,
                       model="gpt2-tiny", cluster="cpu2", freq_backend="none", schedule_applied=False,
                       warmup_iters=1, timed_iters=3, status="ok", iteration_s_mean=measured,
                       iteration_s=(measured,))


def test_calibrated_reranker_orders_by_calibrated_prediction_and_stops_when_nothing_can_win(tmp_path):
    entries = four_strategies()
    path = write_plan(tmp_path, entries)
    ctx, trials, _ = prepare(path, options(tmp_path / "o"))
    plan = load_plan(path)
    inputs = inputs_from_plan(plan, str(path), ctx.cluster)
    strategies = [t.strategy for t in trials]
    truth = 2.0 * predict(measured_set(inputs, strategies, np.ones(len(trials))), _identity())  # hardware = 2×
    measured = [_result(entries[i], float(truth[i])) for i in (0, 1)]
    rerank = calibrated_reranker()
    pending = trials[2:]
    assert rerank(plan, ctx.cluster, measured[:1], pending).order == tuple(t.key for t in pending)  # one: plan order
    decision = rerank(plan, ctx.cluster, measured, pending)
    expected = sorted(pending, key=lambda t: truth[trials.index(t)])
    assert decision.order == tuple(t.key for t in expected)
    # Measure the two truly fastest: the rest are then predicted (calibrated ≈ truth) slower than the best measured.
    fastest = sorted(range(len(trials)), key=lambda i: truth[i])
    done = [_result(entries[i], float(truth[i])) for i in fastest[:2]]
    rest = [trials[i] for i in fastest[2:]]
    gap = min(truth[i] for i in fastest[2:]) / truth[fastest[0]]
    stop = rerank(plan, ctx.cluster, done, rest)
    assert gap > 1.3  # far more than the 10 % error floor
    assert stop.stop_reason is not None and "best measured" in stop.stop_reason
    # ... and measuring the two slowest leaves faster ones to try: no stop
    go = rerank(plan, ctx.cluster, [_result(entries[i], float(truth[i])) for i in fastest[2:]],
                [trials[i] for i in fastest[:2]])
    assert go.stop_reason is None and go.order == tuple(trials[i].key for i in fastest[:2])


def _identity():
    from ampe.formats.calibration import CalibrationParams

    return CalibrationParams()


def test_trial_with_budget_is_adaptive_unless_plan_order_is_asked(tmp_path, run_cli, monkeypatch):
    """`ampe trial --budget` with the fake worker on "hardware" 2× the cost model: the plan lists the strategies
    slowest first (ranks 1–4: 0.35, 0.32, 0.23, 0.20 s per iteration), so after two measured trials the calibrated
    order runs rank 4 before rank 3 (and may then skip 3: it cannot beat 4 by more than the model's error). With
    --plan-order the plan's order is kept and every trial runs."""
    entries = four_strategies()
    path = write_plan(tmp_path, entries)
    ctx, trials, _ = prepare(path, options(tmp_path / "o"))
    inputs = inputs_from_plan(load_plan(path), str(path), ctx.cluster)
    truth = 2.0 * predict(measured_set(inputs, [t.strategy for t in trials], np.ones(len(trials))), _identity())
    assert list(truth) == sorted(truth, reverse=True) and truth[2] > 1.05 * truth[3]  # the premise: slowest first
    per = {f"pp{e['pp']}dp{e['dp']}tp{e['tp']}mbs{e['mbs']}": {"iter_s": float(t)} for e, t in zip(entries, truth,
                                                                                                strict=True)}
    monkeypatch.setenv("AMPE_FAKE_CONTROL", json.dumps(per))  # the fake worker's per-strategy iteration time

    def run(out, *extra):
        code, _, err = run_cli("trial", "--plan", path, "--budget", "600", "--worker", FAKE_WORKER, "--no-prebuild",
                               "--launcher", "local", "--warmup", "1", "--iters", "2", "--freq-backend", "none",
                               "--progress", "none", "--out", out, *extra)
        assert code == 0, err
        lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
        ran = sorted((x for x in lines if x["status"] == "ok"), key=lambda x: x["started_at"])
        summary = json.loads((out / "summary.json").read_text())
        return [x["plan_rank"] for x in ran], {x["plan_rank"]: x["reason"] for x in summary["skipped"]}

    order, skipped = run(tmp_path / "adaptive")
    assert order[:3] == [1, 2, 4], order  # plan order until two are measured, then the calibrated best
    assert order == [1, 2, 4, 3] or (order == [1, 2, 4] and skipped[3].startswith("adaptive: ")), (order, skipped)
    order, skipped = run(tmp_path / "plan-order", "--plan-order")
    assert order == [1, 2, 3, 4] and not skipped
