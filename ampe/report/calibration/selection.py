"""Selecting the structure (:func:`select_structure`) by how well each candidate's leave-one-out predictions order
the measured strategies, with the folds (fits on the strategies less a few held out) that the selection,
leave-one-out, leave-two-out pair concordance and the final fit share (:class:`Folds`)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ampe.report.calibration.fit import FitResult, fit_calibration, fit_theta
from ampe.report.calibration.measured import MeasuredSet, Point, only, predict, uncalibrated_estimates, without
from ampe.report.calibration.structures import Structure, parameter_space, structures

MIN_SELECT = 4  # fewer measured strategies: fit the one time factor, no structure selection
RANK_TOLERANCE = 0.02  # structures this close to the best held-out discordance are ranked by held-out MAPE


@dataclass(frozen=True)
class StructureScore:
    """How well one structure's leave-one-out predictions order the measured strategies they were not fitted on:
    weighted discordance (:func:`held_out_discordance`), the plain fraction of pairs the wrong way (a tie half; what
    Spearman counts), and the held-out MAPE (percent)."""

    discordance: float
    plain_discordance: float
    mape_pct: float


class Folds:
    """Fits on the measured strategies less a few held out, each made once per structure: leave-one-out, the
    structure selection nested in it, and the final fit share the fits that hold out the same strategies (the
    nested leave-one-out of n strategies costs n(n − 1)/2 fits per structure, not n(n − 1))."""

    def __init__(self, sets: Sequence[MeasuredSet], progress: Callable[[float, float], None] | None = None) -> None:
        self.sets = list(sets)
        self.space = parameter_space(self.sets)
        self.candidates = structures(self.space)
        self._by_name = {st.name: st for st in self.candidates}
        self._fits: dict[tuple[str, frozenset[Point]], list[np.ndarray]] = {}
        # progress(fits made, fits the selection makes): one per candidate structure and held-out strategy
        self._progress = progress
        n = len(self.points())
        self.expected = len(self.candidates) * n if n >= MIN_SELECT else 0

    def made_from(self, sets: Sequence[MeasuredSet]) -> bool:
        """Whether these folds were made from exactly ``sets`` (the same objects, in order)."""
        return len(sets) == len(self.sets) and all(a is b for a, b in zip(sets, self.sets, strict=True))

    def points(self, held: frozenset[Point] = frozenset()) -> list[Point]:
        """Every measured strategy but ``held``."""
        return [(k, i) for k, d in enumerate(self.sets) for i in range(len(d.strategies)) if (k, i) not in held]

    def predictions(self, structure: str, held: frozenset[Point]) -> list[np.ndarray]:
        """Seconds per iteration of every strategy of every set (held out or not), under the fit of ``structure``
        on the strategies not in ``held``."""
        key = (structure, held)
        if key not in self._fits:
            train = self.sets
            for point in sorted(held, reverse=True):  # the later index first: the earlier keeps its place
                train = without(train, point)
            theta = fit_theta(train, self.space, np.asarray(self._by_name[structure].free), None,
                           self._by_name[structure])
            params = self.space.decode(theta)
            self._fits[key] = [predict(d, params) for d in self.sets]
            if self._progress is not None and self.expected:
                self._progress(min(len(self._fits), self.expected), self.expected)
        return self._fits[key]

    def score(self, structure: str, held: frozenset[Point] = frozenset()) -> StructureScore:
        """Leave-one-out over the strategies not in ``held``: each predicted by the fit on the others, and placed
        among those others of its set."""
        points = self.points(held)
        num = den = plain = pairs = 0.0
        errors = []
        for k, i in points:
            pred = self.predictions(structure, held | {(k, i)})[k]
            keep = [j for (s, j) in points if s == k]
            at = keep.index(i)
            meas = self.sets[k].measured_s[keep]
            n, d = held_out_discordance(pred[keep], meas, at)
            num, den = num + n, den + d
            wrong = np.delete(_wrong_way(pred[keep], meas, at), at)
            plain += float(np.sum(wrong))
            pairs += len(wrong)
            errors.append(abs(pred[i] - meas[at]) / meas[at])
        return StructureScore(num / den if den > 0 else 0.0, plain / pairs if pairs else 0.0,
                              100.0 * float(np.mean(errors)))

    def held_out(self, structure: str) -> list[np.ndarray]:
        """:func:`leave_one_out` of ``structure`` (a name, or ``"select"``: selected on each fold's others)."""
        out = []
        for k, data in enumerate(self.sets):
            held = np.empty(len(data.strategies))
            for i in range(len(data.strategies)):
                one = frozenset({(k, i)})
                name = self.select(one)[0].name if structure == "select" else structure
                held[i] = self.predictions(name, one)[k][i]
            out.append(held)
        return out

    def allowed(self, scores: dict[str, StructureScore]) -> list[Structure]:
        """The candidates the selection may take: the one time factor (the uncalibrated order, rescaled), and each
        structure whose held-out order is no worse than the time factor's by both discordances."""
        first = scores[self.candidates[0].name]
        return [self.candidates[0]] + [
            st for st in self.candidates[1:] if scores[st.name].discordance <= first.discordance
            and scores[st.name].plain_discordance <= first.plain_discordance]

    def select(self, held: frozenset[Point] = frozenset()) -> tuple[Structure, dict[str, StructureScore]]:
        """:func:`select_structure` on the strategies not in ``held``."""
        if len(self.points(held)) < MIN_SELECT:
            return self.candidates[0], {}
        scores = {st.name: self.score(st.name, held) for st in self.candidates}
        allowed = self.allowed(scores)
        best = min(scores[st.name].discordance for st in allowed)
        tied = [st for st in allowed if scores[st.name].discordance <= best + RANK_TOLERANCE]
        return min(tied, key=lambda st: scores[st.name].mape_pct), scores


def leave_one_out(sets: Sequence[MeasuredSet], free: Sequence[bool] | Structure | str | None = None
                  ) -> list[np.ndarray]:
    """Per set, each strategy's seconds predicted by a fit on all the other measured strategies (``free``: a mask,
    a structure or its name; ``"select"`` selects the structure on each fold's training strategies alone)."""
    if isinstance(free, str):
        return Folds(sets).held_out(free)
    out = []
    for k, data in enumerate(sets):
        held = np.empty(len(data.strategies))
        for i in range(len(data.strategies)):
            if isinstance(free, Structure):
                fit = fit_calibration(sets, skip=(k, i), uncertainty=False, structure=free)
            else:
                fit = fit_calibration(sets, free, skip=(k, i), uncertainty=False)
            held[i] = predict(only(data, i), fit.params)[0]
        out.append(held)
    return out


def select_structure(sets: Sequence[MeasuredSet], skip: Point | None = None, folds: Folds | None = None
                     ) -> tuple[Structure, dict[str, StructureScore]]:
    """The candidate structure (:func:`structures`) whose leave-one-out predictions on ``sets`` (less ``skip``)
    order the strategies best.

    The one time factor (the first candidate) keeps the uncalibrated order; a structure that moves the order is
    allowed only where its held-out order is no worse than the time factor's by both the weighted discordance
    (:func:`held_out_discordance`) and the plain fraction of pairs the wrong way (what Spearman counts): with k ≈ 8
    strategies, a fit that fixes two pairs measured 20 % apart and breaks six measured 2 % apart is no better for the
    next search. Among those allowed: the lowest weighted discordance; among those within ``RANK_TOLERANCE`` of it,
    the lowest held-out MAPE; the simplest on a tie. Fewer than ``MIN_SELECT`` strategies: the time factor. Returns
    it and every candidate's :class:`StructureScore`. ``folds`` (made from ``sets``) shares fits between calls."""
    if folds is None:
        folds = Folds(sets)
    elif not folds.made_from(sets):
        raise ValueError("select_structure: folds were made from other measured sets")
    return folds.select(frozenset() if skip is None else frozenset({skip}))


def fit_selected(sets: Sequence[MeasuredSet], skip: Point | None = None, uncertainty: bool = True) -> FitResult:
    """:func:`~ampe.report.calibration.fit.fit_calibration` of the structure :func:`select_structure` picks on the
    same data (less ``skip``)."""
    return fit_calibration(sets, skip=skip, uncertainty=uncertainty, structure=select_structure(sets, skip)[0])


def pair_concordance(data: MeasuredSet, structures: Sequence[str] = ("select",), folds: Folds | None = None
                     ) -> dict[str, float]:
    """Leave-two-out (k = n − 2 fitted): for every pair of strategies, fit on the others and ask whether the one fit
    orders the pair as measured; the fraction right, each pair weighted by |log measured ratio| (a pair measured
    1 % apart counts little; a predicted tie is half right). Unlike leave-one-out Spearman, both predictions of a
    pair come from one fit. ``structures``: names, or ``"select"`` (selected on the pair's others alone). Keys:
    ``"uncalibrated"`` and each structure's name. ``folds`` (made from ``[data]``) shares fits."""
    if folds is None:
        folds = Folds([data])
    elif not folds.made_from([data]):
        raise ValueError("pair_concordance: folds were made from other measured strategies")
    n, m = len(data.strategies), data.measured_s
    before = uncalibrated_estimates(data)
    right = dict.fromkeys(("uncalibrated", *structures), 0.0)
    total = 0.0
    for i, j in itertools.combinations(range(n), 2):
        w = abs(math.log(m[i] / m[j]))
        total += w
        held = frozenset({(0, i), (0, j)})
        preds = {"uncalibrated": before[[i, j]]}
        for name in structures:
            fitted = folds.select(held)[0].name if name == "select" else name
            preds[name] = folds.predictions(fitted, held)[0][[i, j]]
        for name, (pi, pj) in preds.items():
            right[name] += w * (0.5 if pi == pj else float((pi - pj) * (m[i] - m[j]) > 0))
    return {k: v / total if total > 0 else 1.0 for k, v in right.items()}


def held_out_discordance(pred: np.ndarray, meas: np.ndarray, i: int) -> tuple[float, float]:
    """How wrongly strategy ``i`` (held out) is placed among the others: Σ over the others of
    |log measured ratio| where the predicted order of the pair is the wrong way (a predicted tie counts half), and
    Σ |log measured ratio| (the weights: a pair measured 1 % apart counts little)."""
    w = np.abs(np.log(meas / meas[i]))
    return float(np.sum(w * _wrong_way(pred, meas, i))), float(np.sum(w))


def _wrong_way(pred: np.ndarray, meas: np.ndarray, i: int) -> np.ndarray:
    """Per strategy, whether its pair with strategy ``i`` is predicted the wrong way round: 1, a predicted or
    measured tie 0.5 (strategy ``i`` itself included, as a tie), else 0."""
    sign = np.sign(pred - pred[i]) * np.sign(meas - meas[i])
    return np.where(sign < 0, 1.0, np.where(sign == 0, 0.5, 0.0))
