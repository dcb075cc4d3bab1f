"""What devices cost to hold and to power, and what their power emits: the cluster spec's prices, per device.

Spec fields (``docs/reference/cluster_spec.md#prices-electricity-and-carbon``)::

    currency: USD                       # a label only (default "units")
    electricity_per_kwh: 0.12           # defaults for every node group (a "site") that gives none
    carbon_g_per_kwh: 380
    pue: 1.2                            # facility power / IT power, ≥ 1 (default 1)
    gpu_types:
      T4: {price_per_hour: 0.53}        # per GPU type (an entry with only a price keeps the catalog type as it is)
    nodes:
      - {name: p3, gpu: V100-16GB, ..., price_per_hour: 3.06, electricity_per_kwh: 0.09, carbon_g_per_kwh: 45}

A node group's own value overrides its GPU type's (``price_per_hour``) or the spec's top-level one (the site fields).
This module only holds the figures and turns them into the weights one strategy's point is priced with
(:func:`strategy_weights`); the sums over a point are :mod:`ampe.energy.price`'s.

Cost of one iteration of a strategy that holds its devices D for the iteration time T and uses E_d joules on
device d (the energy model's, every device of the strategy, waiting included)::

    cost   = T / 3600 · Σ_{d∈D} price_per_hour_d  +  Σ_d E_d / 3.6e6 · pue_d · electricity_per_kwh_d
    carbon =                                         Σ_d E_d / 3.6e6 · pue_d · carbon_g_per_kwh_d      (grams CO2e)

Devices the strategy leaves out (``ampe search --devices auto``) are neither rented nor powered. Embodied carbon
(making the GPUs) and host power beyond the GPUs are not counted: PUE covers the facility, not the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ampe.errors import InputError

J_PER_KWH = 3.6e6
PRICED = ("cost", "carbon")  # the objectives that need prices (ampe.energy.objective)
FIGURES = (*PRICED, "kwh")  # kwh: facility kWh (device energy × PUE), what the other two price


@dataclass(frozen=True)
class DevicePrice:
    """One device's figures from the spec (None where the spec gives none) and where each came from."""

    price_per_hour: float | None  # currency units per GPU-hour
    electricity_per_kwh: float | None  # currency units per kWh at the facility meter
    carbon_g_per_kwh: float | None  # grams CO2e per kWh at the facility meter
    pue: float  # facility power over IT power (≥ 1)
    price_field: str  # the spec field the hourly price came from, or the fields that could give it
    site_field: str  # the node group the site fields belong to ("nodes[1]")


@dataclass(frozen=True)
class Pricing:
    """The cluster's prices, one entry per device (in device order), and the spec they came from."""

    currency: str
    devices: tuple[DevicePrice, ...]
    source: str

    def subset(self, ids: Sequence[int]) -> Pricing:
        """The prices of devices ``ids`` only, in that order (as :meth:`Cluster.subset` renumbers them)."""
        return Pricing(self.currency, tuple(self.devices[d] for d in ids), self.source)

    def missing(self, objective: str) -> tuple[str, str] | None:
        """(field, why) of the first device whose figure ``objective`` needs is not in the spec; None if none."""
        for d in self.devices:
            if objective == "cost" and d.price_per_hour is None:
                return d.price_field, "no GPU price (currency units per GPU-hour)"
            if objective == "cost" and d.electricity_per_kwh is None:
                return (f"{d.site_field}.electricity_per_kwh", "no electricity price (give 0 where the hourly price "
                        "includes power, or a top-level electricity_per_kwh for every node group)")
            if objective == "carbon" and d.carbon_g_per_kwh is None:
                return (f"{d.site_field}.carbon_g_per_kwh", "no carbon intensity (grams CO2e per kWh; or a top-level "
                        "carbon_g_per_kwh for every node group)")
        return None


def require(pricing: Pricing | None, objective: str, source: str) -> Pricing:
    """The cluster's prices when they have every figure ``objective`` (cost, carbon) needs; otherwise
    :class:`InputError` naming the spec field that is missing (never a silent zero)."""
    if pricing is None:
        field, why = ("price_per_hour", "the spec gives no prices: add nodes[].price_per_hour (or gpu_types.<T>."
                      "price_per_hour) and electricity_per_kwh") if objective == "cost" else \
            ("carbon_g_per_kwh", "the spec gives no carbon intensity: add carbon_g_per_kwh (top level or per node "
             "group)")
        raise InputError(source, field, f"{why}; --objective {objective} needs it")
    gap = pricing.missing(objective)
    if gap is not None:
        raise InputError(source, gap[0], f"{gap[1]}; --objective {objective} needs it for every device")
    return pricing


@dataclass(frozen=True)
class Weights:
    """How one strategy's point is priced: ``per_second`` (units per second of iteration: the rent of every device
    the strategy holds; 0 for carbon) and ``per_joule[r][s]`` (units per joule of device energy, PUE included) of
    device stage s of data-parallel replica r: the mean over its tensor-parallel devices, whose energies are equal."""

    per_second: float
    per_joule: tuple[tuple[float, ...], ...]

    def uniform(self, replica: int) -> float | None:
        """The one per-joule weight of every stage of ``replica``, or None when its stages are priced differently."""
        w = self.per_joule[replica]
        return w[0] if all(x == w[0] for x in w) else None


def strategy_weights(pricing: Pricing, strategy: object, what: str) -> Weights:
    """The weights of ``what`` (``"cost"``, ``"carbon"`` or ``"kwh"``) for a strategy placed on the priced cluster
    (``strategy``: a :class:`~ampe.costmodel.strategy.Strategy` with a placement). Figures the spec lacks count as
    zero here; :func:`require` refuses them first where an objective needs them."""
    if what not in FIGURES:
        raise ValueError(f"unknown priced figure {what!r}; one of {', '.join(FIGURES)}")
    s = strategy
    placement = getattr(s, "placement", None)
    if placement is None:
        raise ValueError("a strategy needs a placement to be priced")
    devices = pricing.devices
    per_second = 0.0
    if what == "cost":
        per_second = sum(devices[d].price_per_hour or 0.0 for d in set(placement)) / 3600.0
    rows = []
    for r in range(s.dp):  # type: ignore[attr-defined]
        row = []
        for st in range(s.pp):  # type: ignore[attr-defined]
            ids = s.stage_devices(st, r)  # type: ignore[attr-defined]
            row.append(sum(joule_weight(devices[d], what) for d in ids) / len(ids))
        rows.append(tuple(row))
    return Weights(per_second, tuple(rows))


def joule_weight(d: DevicePrice, what: str) -> float:
    """Units (currency, grams CO2e or facility kWh) per joule of this device's energy, PUE included (0 where not
    given)."""
    per_kwh = {"cost": d.electricity_per_kwh, "carbon": d.carbon_g_per_kwh, "kwh": 1.0}[what]
    return (per_kwh or 0.0) * d.pue / J_PER_KWH


def describe(pricing: Pricing, ids: Sequence[int] | None = None) -> str:
    """Where the figures come from, per distinct (price, site): e.g. ``V100-16GB 3.06/h (nodes[0].price_per_hour),
    0.09/kWh, 45 g/kWh, PUE 1.1 (nodes[0])``; ``ids``: only these devices."""
    seen: dict[tuple, str] = {}
    for d in (pricing.devices if ids is None else [pricing.devices[i] for i in ids]):
        key = (d.price_per_hour, d.price_field, d.electricity_per_kwh, d.carbon_g_per_kwh, d.pue, d.site_field)
        if key in seen:
            continue
        parts = [f"{_num(d.price_per_hour)}/GPU-h ({d.price_field})" if d.price_per_hour is not None else
                 "no GPU price"]
        parts.append(f"{_num(d.electricity_per_kwh)}/kWh" if d.electricity_per_kwh is not None else "no kWh price")
        parts.append(f"{_num(d.carbon_g_per_kwh)} gCO2e/kWh" if d.carbon_g_per_kwh is not None else
                     "no carbon intensity")
        seen[key] = ", ".join(parts) + f", PUE {d.pue:g} ({d.site_field})"
    return "; ".join(seen.values())


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"
