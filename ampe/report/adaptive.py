"""Adaptive trial order for ``ampe trial --budget``: after each measured trial, calibrate on what was measured,
re-predict the strategies still to run, and run the predicted best next.

The reranker (:func:`calibrated_reranker`) is handed to the trial runner (``TrialOptions.rerank``). From two measured
strategies on (plain runs, not frequency-scheduled ones), it fits the structural calibration of
:mod:`ampe.report.calibrate` on them and orders the pending strategies by calibrated predicted time; a scheduled
trial follows its twin without the schedule. It says stop when no pending strategy can beat the best measured one by
more than the model's error::

    stop  ⇔  min_pending predicted_s × (1 − error) ≥ best measured_s

with ``error`` the calibrated model's in-sample MAPE on the measured strategies, and at least ``min_error`` (10 % by
default: two or three points fit almost exactly, which says little about the rest).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ampe.costmodel.cluster import Cluster
from ampe.costmodel.strategy import strategy_from_dict
from ampe.formats.trial import TrialResult
from ampe.report.calibration.fit import fit_calibration
from ampe.report.calibration.measured import CalibrationInputs, inputs_from_plan, measured_set, predict
from ampe.report.compare import mape
from ampe.trials.planfile import TrialPlan
from ampe.trials.prepare import PlannedTrial, Rerank

MIN_MEASURED = 2  # fewer measured strategies: keep the plan's order


def calibrated_reranker(min_error: float = 0.10
                        ) -> Callable[[TrialPlan, Cluster, Sequence[TrialResult], Sequence[PlannedTrial]], Rerank]:
    """A reranker for :class:`ampe.trials.prepare.TrialOptions` (see the module docstring)."""
    cache: dict[str, CalibrationInputs] = {}

    def rerank(plan: TrialPlan, cluster: Cluster, results: Sequence[TrialResult],
               pending: Sequence[PlannedTrial]) -> Rerank:
        keep = Rerank(tuple(t.key for t in pending))
        ok = [r for r in results if r.status == "ok" and not r.schedule_applied and r.iteration_s_mean]
        if len(ok) < MIN_MEASURED:
            return keep
        if "inputs" not in cache:
            cache["inputs"] = inputs_from_plan(plan, plan.source, cluster)
        inputs = cache["inputs"]
        measured = np.array([float(r.iteration_s_mean or 0.0) for r in ok])
        data = measured_set(inputs, [strategy_from_dict(r.strategy, "results") for r in ok], measured)
        fit = fit_calibration([data], uncertainty=False)
        error = max(min_error, (mape(predict(data, fit.params), measured) or 0.0) / 100.0)
        plain = [t for t in pending if t.schedule is None]
        if not plain:
            return keep
        todo = measured_set(inputs, [t.strategy for t in plain], np.ones(len(plain)))
        predicted = dict(zip((t.key for t in plain), predict(todo, fit.params), strict=True))
        best = float(measured.min())
        base_of = {t.key: predicted.get(t.baseline_key or "", np.inf) for t in pending if t.schedule is not None}
        order = sorted(pending, key=lambda t: (predicted.get(t.key, base_of.get(t.key, np.inf)),
                                               t.schedule is not None, t.key))
        lowest = min(predicted.values())
        if lowest * (1.0 - error) >= best:
            return Rerank(tuple(t.key for t in order),
                          f"no remaining strategy can beat the best measured ({best:.4g} s) by more than the "
                          f"calibrated model's error ({error:.0%}): best remaining predicted {lowest:.4g} s")
        return Rerank(tuple(t.key for t in order))

    return rerank
