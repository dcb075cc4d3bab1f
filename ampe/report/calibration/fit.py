"""The fit: the maximum a posteriori parameters of one structure on measured strategies (scipy's ``least_squares``
on log residuals with a Gaussian prior), their Gauss–Newton posterior sds, and which of them the data identified
(the model and the priors: :mod:`ampe.report.calibrate`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ampe.formats.calibration import CalibrationParams, FittedParameter
from ampe.report.calibration.measured import MeasuredSet, predict
from ampe.report.calibration.structures import ParameterSpace, Structure, parameter_space, structures

RESIDUAL_SD = 0.05  # relative error the fit expects of one measurement against the cost model
IDENTIFIED = 0.5  # a parameter is fitted when the data shrink its prior sd to below this fraction
MAX_EVALUATIONS = 60  # cost-model passes per fit (each costs every measured strategy once)


@dataclass(frozen=True)
class FitResult:
    """Fitted parameters, which of them the data identified, and in-sample errors (percent)."""

    params: CalibrationParams
    theta: np.ndarray
    free: tuple[bool, ...]  # moved by the fit's structure (the others stayed at the prior)
    identified: tuple[bool, ...]  # the data shrank its prior sd below IDENTIFIED
    posterior_sd: np.ndarray
    space: ParameterSpace
    structure: str = "full"  # the candidate structure fitted (:func:`structures`)
    at_bound: tuple[bool, ...] = ()  # a link held at its bound 1 that the fit would lift (time factor) or push past


def fit_calibration(sets: Sequence[MeasuredSet], free: Sequence[bool] | None = None,
                    skip: tuple[int, int] | None = None, uncertainty: bool = True,
                    structure: Structure | str | None = None) -> FitResult:
    """Fit the parameters on every measured strategy of ``sets`` (but ``skip`` = (set, index), for leave-one-out).

    ``structure`` says which parameters move (a :class:`Structure` or the name of one of :func:`structures`; the
    selected one: :func:`ampe.report.calibration.selection.fit_selected`). Without it, ``free`` (a mask) or else
    every parameter moves; the rest stay at the prior. ``uncertainty`` also computes each parameter's posterior sd
    and whether the data identified it (one more cost-model pass per parameter)."""
    space = parameter_space(sets)
    if isinstance(structure, str):
        st = {c.name: c for c in structures(space)}[structure]
    elif structure is not None:
        st = structure
    else:
        mask = np.ones(len(space.names), dtype=bool) if free is None else np.asarray(free, dtype=bool)
        st = Structure.select("free", mask, space)
    x = fit_columns(sets, space, skip, st)
    theta = st.theta(space, x)
    sd = _posterior_sd(sets, space, theta, skip) if uncertainty else np.full(len(theta), np.nan)
    moved = st.moves(space)
    # Identified: moved by the structure and pinned by the data. A parameter the structure holds at the prior is not
    # (the scale structure kept η = 0 while the data's posterior sd called it identified).
    # At its bound: a link the time factor would lift past 1, or one its own column would push past it.
    held = np.asarray(pushed_to_bound(sets, space, theta, moved, skip)) | st.lifted(space, x) if uncertainty else ()
    return FitResult(space.decode(theta), theta, moved,
                     tuple(bool(m and x) for m, x in zip(moved, sd < IDENTIFIED * space.prior_sd, strict=True)),
                     sd, space, st.name, tuple(bool(b) for b in held))


BOUND_TOLERANCE = 1e-3  # a log parameter this close to its upper bound is at it (the fit stops just inside)


def pushed_to_bound(sets: Sequence[MeasuredSet], space: ParameterSpace, theta: np.ndarray, moved: Sequence[bool],
                    skip: tuple[int, int] | None = None) -> tuple[bool, ...]:
    """Per parameter: whether it is a link efficiency the fit holds at its upper bound (1, the spec's bandwidth)
    while the measurements want it higher: the posterior objective falls when it alone is raised 1 % past the
    bound. (At 1 without that, the bound is the prior and nothing pushes against it.)

    Args:
        sets, skip: the measured strategies the fit saw (``skip``: the one held out).
        space: the parameter space; ``theta`` the fitted vector (internal units); ``moved``: which the fit moved.

    Returns:
        One flag per parameter of ``space``.
    """
    f = _residuals(sets, space, skip)
    base: float | None = None
    out = []
    for i, name in enumerate(space.names):
        hit = bool(moved[i]) and name.startswith("link_efficiency:") and bool(
            theta[i] >= space.upper[i] - BOUND_TOLERANCE)
        if hit:
            base = float(np.sum(f(theta) ** 2)) if base is None else base
            raised = theta.copy()
            raised[i] = space.upper[i] + 0.01
            hit = bool(float(np.sum(f(raised) ** 2)) < base)
        out.append(hit)
    return tuple(out)


def _data_residuals(sets: Sequence[MeasuredSet], space: ParameterSpace, skip: tuple[int, int] | None
                    ) -> Callable[[np.ndarray], np.ndarray]:
    logs = [np.log(s.measured_s) for s in sets]

    def f(theta: np.ndarray) -> np.ndarray:
        params = space.decode(theta)
        parts = []
        for k, data in enumerate(sets):
            r = (np.log(predict(data, params)) - logs[k]) / RESIDUAL_SD
            if skip is not None and skip[0] == k:
                r = np.delete(r, skip[1])
            parts.append(r)
        return np.concatenate(parts)

    return f


def _residuals(sets: Sequence[MeasuredSet], space: ParameterSpace, skip: tuple[int, int] | None
               ) -> Callable[[np.ndarray], np.ndarray]:
    data = _data_residuals(sets, space, skip)
    return lambda theta: np.concatenate([data(theta), (theta - space.prior) / space.prior_sd])


def fit_theta(sets: Sequence[MeasuredSet], space: ParameterSpace, free: np.ndarray,
              skip: tuple[int, int] | None, structure: Structure | None = None) -> np.ndarray:
    """The fitted parameter vector (internal units) of ``structure`` (else every ``free`` parameter on its own)."""
    st = structure or Structure.select("free", free, space)
    return st.theta(space, fit_columns(sets, space, skip, st))


def fit_columns(sets: Sequence[MeasuredSet], space: ParameterSpace, skip: tuple[int, int] | None,
                st: Structure) -> np.ndarray:
    """The maximum a posteriori column values x of structure ``st`` (θ = :meth:`Structure.theta`)."""
    from scipy.optimize import least_squares

    if st.design.shape[1] == 0:
        return np.zeros(0)
    data_residuals = _data_residuals(sets, space, skip)

    def f(x: np.ndarray) -> np.ndarray:
        return np.concatenate([data_residuals(st.theta(space, x)), x / st.prior_sd])

    # Start a tenth of a prior sd inside the bounds: scipy's trust region does not leave a start on a bound
    # (a zero instruction cost, the prior on GPUs) and stops at once.
    margin = 0.1 * st.prior_sd
    x0 = np.clip(np.zeros(len(st.prior_sd)), st.lower + margin, st.upper - margin)
    res = least_squares(f, x0, bounds=(st.lower, st.upper), diff_step=1e-3, max_nfev=MAX_EVALUATIONS,
                        x_scale=st.prior_sd)
    return np.asarray(res.x)


def _posterior_sd(sets: Sequence[MeasuredSet], space: ParameterSpace, theta: np.ndarray,
                  skip: tuple[int, int] | None) -> np.ndarray:
    """Gauss–Newton posterior sd of every parameter at ``theta`` (prior included)."""
    f = _residuals(sets, space, skip)
    r0 = f(theta)
    n_data = len(r0) - len(theta)
    jac = np.empty((n_data, len(theta)))
    for j in range(len(theta)):
        h = 1e-3 * max(1.0, abs(theta[j]))
        t = theta.copy()
        t[j] += h
        if t[j] > space.upper[j]:
            t[j] = theta[j] - h
            h = -h
        jac[:, j] = (f(t)[:n_data] - r0[:n_data]) / h
    precision = jac.T @ jac + np.diag(1.0 / space.prior_sd ** 2)
    return np.sqrt(np.diag(np.linalg.pinv(precision)))


def fitted_parameters(fit: FitResult) -> tuple[FittedParameter, ...]:
    sp = fit.space
    out = []
    for i, name in enumerate(sp.names):
        kind, _, key = name.partition(":")
        out.append(FittedParameter(name=f"{kind}[{key}]" if key else kind, value=sp.shown(i, fit.theta[i]),
                                   prior=sp.shown(i, sp.prior[i]), fitted=fit.identified[i],
                                   posterior_sd=float(fit.posterior_sd[i]), moved=fit.free[i],
                                   at_bound=fit.at_bound[i] if fit.at_bound and kind == "link_efficiency" else None))
    return tuple(out)
