"""The calibrated parameters as a vector (:class:`ParameterSpace`: names, priors, bounds) and which of them a fit
moves (:class:`Structure`): the four nested candidate structures the selection chooses among (:func:`structures`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ampe.costmodel.calibration import link_classes
from ampe.formats.calibration import CalibrationParams
from ampe.report.calibration.measured import MeasuredSet

TYPE_SD = 0.25  # prior sd (log) of a GPU type's compute factor about the types' common factor
LINK_UPPER = 0.0  # log of a link efficiency's upper bound, 1: the spec's bandwidth (the prior, too)


@dataclass(frozen=True)
class ParameterSpace:
    """The calibrated parameters as a vector: names, prior means and sds, bounds (internal units: log factors,
    milliseconds for instruction costs)."""

    names: tuple[str, ...]
    prior: np.ndarray
    prior_sd: np.ndarray
    lower: np.ndarray
    upper: np.ndarray

    def decode(self, theta: np.ndarray) -> CalibrationParams:
        """The parameters ``theta`` stands for."""
        compute, ops, links, eta = {}, {}, {}, 0.0
        for name, x in zip(self.names, theta, strict=True):
            kind, _, key = name.partition(":")
            if kind == "compute_factor":
                compute[key] = math.exp(x)
            elif kind == "pipeline_op_s":
                ops[key] = max(float(x), 0.0) * 1e-3
            elif kind == "link_efficiency":
                links[key] = math.exp(x)
            else:
                eta = float(x)
        return CalibrationParams(compute_factor=compute, mbs_exponent=eta, pipeline_op_s=ops,
                                 link_efficiency=links)  # type: ignore[arg-type]

    def shown(self, i: int, x: float) -> float:
        """Parameter ``i`` at internal value ``x`` in its public unit (factor, exponent, seconds)."""
        kind = self.names[i].partition(":")[0]
        return math.exp(x) if kind in ("compute_factor", "link_efficiency") else x * 1e-3 if \
            kind == "pipeline_op_s" else x


@dataclass(frozen=True)
class Structure:
    """Which parameters a fit moves: θ = θ₀ + design · x, with a prior x ~ N(0, prior_sd²) inside [lower, upper].

    ``scale`` (a column index, or −1): that column is one common time factor (log): it adds to every compute
    factor's log, subtracts from every link efficiency's (never past 1: :meth:`theta`), and multiplies every
    instruction cost, so a factor ≥ 1 moves every strategy's time together and keeps the uncalibrated ranking (up
    to the terms it does not scale: latencies); a factor < 1 leaves the links at their spec, so strategies that
    communicate more gain less."""

    name: str
    design: np.ndarray  # (parameters, columns)
    prior_sd: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    scale: int = -1

    def theta(self, space: ParameterSpace, x: np.ndarray) -> np.ndarray:
        """The full parameter vector for column values ``x``. A link efficiency never exceeds its upper bound (1:
        a link cannot beat its spec): where the common time factor would raise it past 1 (every time faster) it
        stays at 1 and the factor speeds the compute alone, inside the fit, so the factor is fitted with it."""
        theta = space.prior + self.design @ x
        if self.scale >= 0:
            ops = np.array([n.startswith("pipeline_op_s:") for n in space.names])
            theta[ops] = space.prior[ops] * math.exp(float(x[self.scale])) + (self.design[ops] @ x)
            theta[self.lifted(space, x)] = space.upper[self.lifted(space, x)]
        return theta

    def lifted(self, space: ParameterSpace, x: np.ndarray) -> np.ndarray:
        """Per parameter: a link efficiency that column values ``x`` would lift past its upper bound (only the
        common time factor can: a link's own column is bounded), which :meth:`theta` holds at the bound."""
        links = np.array([n.startswith("link_efficiency:") for n in space.names])
        return links & (space.prior + self.design @ x > space.upper)

    @property
    def free(self) -> tuple[bool, ...]:
        """Parameters this structure moves."""
        return tuple(bool(x) for x in np.any(self.design != 0, axis=1))

    def moves(self, space: ParameterSpace) -> tuple[bool, ...]:
        """:attr:`free`, and the non-zero instruction costs the time factor multiplies."""
        ops = [n.startswith("pipeline_op_s:") and self.scale >= 0 and bool(p != 0)
               for n, p in zip(space.names, space.prior, strict=True)]
        return tuple(bool(f or o) for f, o in zip(self.free, ops, strict=True))

    @classmethod
    def select(cls, name: str, mask: Sequence[bool] | np.ndarray, space: ParameterSpace,
               scale: bool = False) -> Structure:
        """Each parameter of ``mask`` on its own (with its prior), plus one common time factor if ``scale``."""
        mask = np.asarray(mask, dtype=bool)
        idx = np.flatnonzero(mask)
        design = np.zeros((len(space.names), len(idx) + scale))
        design[idx, np.arange(len(idx))] = 1.0
        sd, lo, hi = space.prior_sd[idx], space.lower[idx] - space.prior[idx], space.upper[idx] - space.prior[idx]
        if scale:
            kinds = [n.partition(":")[0] for n in space.names]
            design[:, -1] = [1.0 if k == "compute_factor" else -1.0 if k == "link_efficiency" else 0.0
                             for k in kinds]
            sd, lo, hi = (np.append(sd, 1.0), np.append(lo, math.log(1e-3)), np.append(hi, math.log(1e3)))
        return cls(name, design, sd, lo, hi, len(idx) if scale else -1)

    def pooled_compute(self, space: ParameterSpace) -> Structure:
        """This structure with the per-type compute factors (when it moves two or more) as one common factor (prior
        sd e^±1) times a per-type deviation (prior sd e^±``TYPE_SD``): the types' relative speeds stay near the
        catalog's unless the data insist. Trials on a mixed cluster see the types' factors mostly through their
        pooled effect, which trades off against the link efficiencies."""
        rows = [i for i, n in enumerate(space.names) if n.startswith("compute_factor:") and self.free[i]]
        if len(rows) < 2:
            return self
        common = np.zeros((len(space.names), 1))
        common[rows, 0] = 1.0
        return Structure(self.name, np.hstack([self.design, common]), np.append(np.where(
            np.any(self.design[rows] != 0, axis=0), TYPE_SD, self.prior_sd), 1.0),
            np.append(self.lower, math.log(1e-3)), np.append(self.upper, math.log(1e3)), self.scale)


def structures(space: ParameterSpace) -> tuple[Structure, ...]:
    """The candidate structures, simplest first: one time factor; + the micro-batch exponent; per-type compute
    factors (pooled: :meth:`Structure.pooled_compute`), exponent and instruction costs; everything (+ link
    efficiencies)."""
    kinds = np.array([n.partition(":")[0] for n in space.names])
    eta = kinds == "mbs_exponent"
    no_links = kinds != "link_efficiency"
    return (Structure.select("scale", np.zeros(len(kinds), dtype=bool), space, scale=True),
            Structure.select("scale+mbs", eta, space, scale=True),
            Structure.select("compute+mbs+ops", no_links, space).pooled_compute(space),
            Structure.select("full", np.ones(len(kinds), dtype=bool), space).pooled_compute(space))


def parameter_space(sets: Sequence[MeasuredSet]) -> ParameterSpace:
    """Every parameter the sets could inform: per GPU type (compute, instruction cost), η, per link class."""
    types: dict[str, float] = {}
    classes: list[str] = []
    for s in sets:
        for g in s.inputs.cluster.gpu_types():
            types.setdefault(g.name, g.pipeline_op_s)
        classes += [c for c in link_classes(s.inputs.cluster) if c not in classes]
    names, prior, sd, lo, hi = [], [], [], [], []

    def add(name: str, p: float, s: float, low: float, high: float) -> None:
        names.append(name)
        prior.append(p)
        sd.append(s)
        lo.append(low)
        hi.append(high)

    for t in types:
        add(f"compute_factor:{t}", 0.0, 1.0, math.log(1e-3), math.log(1e3))
    add("mbs_exponent", 0.0, 0.5, -0.5, 0.95)
    for t, op in types.items():
        add(f"pipeline_op_s:{t}", op * 1e3, 5.0, 0.0, 1e4)
    for c in sorted(classes):  # at most 1: a link cannot carry more than the spec's bandwidth
        add(f"link_efficiency:{c}", 0.0, 1.0, math.log(1e-3), LINK_UPPER)
    return ParameterSpace(tuple(names), *(np.array(v, dtype=float) for v in (prior, sd, lo, hi)))
