"""The money and CO2e table of ``ampe search`` (a priced cluster spec): figures from the plan's ``predicted.cost``,
where they came from, and the sentences of :func:`ampe.planning.cost_findings`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ampe.cli._common import print_table
from ampe.formats.plan import PlanCost, StrategyEntry
from ampe.planning import CheaperWithout, CostFinding, DevicesAutoHint, NoSubsetWithinBound, PricedChoice
from ampe.units import money, si


def print_cost(entries: Sequence[StrategyEntry], findings: Sequence[CostFinding]) -> None:
    """The table (one row per plan entry that has ``predicted.cost``), the line saying where the figures came from,
    and one ``note:`` line per finding."""
    priced = [(e, e.predicted.cost) for e in entries if e.predicted.cost is not None]
    if priced:
        cur = priced[0][1].currency
        run = priced[0][1].iterations

        def grams(g: float | None) -> str:
            return "-" if g is None else si(g, "g")

        def power_share(c: PlanCost) -> str:
            total = c.per_iteration
            return "-" if not total else f"{100 * (c.electricity_per_iteration or 0) / total:.1f}"

        print_table(f"money and emissions per iteration ({cur}; every device of a strategy held for its iteration)"
                    + (f" and per run of {run} iterations" if run else ""),
                    ["rank", "pp/dp/tp", "devices", "energy ×PUE", f"{cur}/iter", "power %", f"{cur}/1M tok",
                     "CO2e/iter"] + ([f"{cur}/run", "CO2e/run"] if run else []),
                    [[e.rank, f"{e.pp}/{e.dp}/{e.tp}", c.devices,
                      si(c.energy_kwh_per_iteration * 1000, "Wh"), money(c.per_iteration), power_share(c),
                      money(c.per_million_tokens), grams(c.co2e_g_per_iteration)]
                     + ([money(c.per_run), grams(None if c.co2e_kg_per_run is None else 1000 * c.co2e_kg_per_run)]
                        if run else [])
                     for e, c in priced])
        print(f"{cur}/iter: GPU-hours × price_per_hour plus energy × PUE × electricity_per_kwh (power %: the "
              "electricity's share); CO2e: energy × PUE × carbon_g_per_kwh, no embodied carbon; energy: every device "
              "of the strategy, GPUs only (no host power), at the facility meter. Prices from the cluster spec: "
              f"{_all_prices(c for _, c in priced)}. Energy {priced[0][1].energy_source}. '-': the spec lacks that "
              "price.")
    for finding in findings:
        print(f"note: {finding_line(finding)}")


def finding_line(f: CostFinding) -> str:
    """One finding of :func:`ampe.planning.cost_findings` as the sentence ``ampe search`` prints after ``note:``."""
    if isinstance(f, DevicesAutoHint):
        return "--devices auto also prices strategies that leave out a GPU-type group (sometimes cheaper per token)"
    if isinstance(f, NoSubsetWithinBound):
        return (f"no strategy that leaves out a GPU-type group is within --max-slowdown {100 * f.max_slowdown:g} % "
                f"(the fastest, by the cost model, takes {f.fastest_subset_s:.4g} s, "
                f"{100 * (f.fastest_subset_s / f.fastest_s - 1):.0f} % more): a wider bound also prices them")
    return _cheaper_line(f)


def _cheaper_line(f: CheaperWithout) -> str:
    def shown(x: float) -> str:
        return si(x, "g CO2e") if f.measure == "carbon" else f"{money(x)} {f.currency}"

    def name(c: PricedChoice) -> str:
        return f"rank {c.rank}" if c.rank else f"{c.pp}/{c.dp}/{c.tp} mbs {c.mbs}, beyond the top {f.top_k},"

    verb = "emits less" if f.measure == "carbon" else "is cheaper"
    head = (f"leaving out {f.left_out} {verb} per token: {name(f.best)} at {shown(f.best.per_iteration)}/iteration")
    ref = f.reference
    if ref is None:
        return f"{head} leaves it out, and no strategy on every device came among the {f.priced} priced"
    dt = f.best.time_s / ref.time_s - 1
    return (f"{head} against the best on every device, {name(ref)} at {shown(ref.per_iteration)}/iteration: "
            f"{100 * (1 - f.best.per_iteration / ref.per_iteration):.1f} % less, {abs(dt) * 100:.1f} % "
            f"{'slower' if dt >= 0 else 'faster'}")


def _all_prices(costs: Iterable[PlanCost]) -> str:
    """Every node group's prices that some ranked strategy uses, once each, in order of first use: a strategy with
    another group's devices (``--devices auto``) is priced with that group's figures too."""
    groups: list[str] = []
    for c in costs:
        for group in c.prices.split("; "):
            if group not in groups:
                groups.append(group)
    return "; ".join(groups)
