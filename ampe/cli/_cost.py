"""The money and CO2e table of ``ampe search`` (a priced cluster spec): figures from the plan's ``predicted.cost``,
where they came from, and the notes of :func:`ampe.planning.cost_notes`."""

from __future__ import annotations

from typing import Any

from ampe.cli._common import print_table
from ampe.units import money, si


def print_cost(entries: list[dict[str, Any]], notes: tuple[str, ...]) -> None:
    """The table (one row per plan entry that has ``predicted.cost``), the line saying where the figures came from,
    and the notes."""
    priced = [(e, e["predicted"]["cost"]) for e in entries if e["predicted"].get("cost")]
    if priced:
        cur = priced[0][1]["currency"]
        run = priced[0][1].get("iterations")

        def grams(g: float | None) -> str:
            return "-" if g is None else si(g, "g")

        def power_share(c: dict[str, Any]) -> str:
            total = c.get("per_iteration")
            return "-" if not total else f"{100 * c['electricity_per_iteration'] / total:.1f}"

        print_table(f"money and emissions per iteration ({cur}; every device of a strategy held for its iteration)"
                    + (f" and per run of {run} iterations" if run else ""),
                    ["rank", "pp/dp/tp", "devices", "energy ×PUE", f"{cur}/iter", "power %", f"{cur}/1M tok",
                     "CO2e/iter"] + ([f"{cur}/run", "CO2e/run"] if run else []),
                    [[e["rank"], f"{e['pp']}/{e['dp']}/{e['tp']}", c["devices"],
                      si(c["energy_kwh_per_iteration"] * 1000, "Wh"), money(c.get("per_iteration")), power_share(c),
                      money(c.get("per_million_tokens")), grams(c.get("co2e_g_per_iteration"))]
                     + ([money(c.get("per_run")),
                         grams(None if c.get("co2e_kg_per_run") is None else 1000 * c["co2e_kg_per_run"])]
                        if run else [])
                     for e, c in priced])
        print(f"{cur}/iter: GPU-hours × price_per_hour plus energy × PUE × electricity_per_kwh (power %: the "
              "electricity's share); CO2e: energy × PUE × carbon_g_per_kwh, no embodied carbon; energy: every device "
              "of the strategy, GPUs only (no host power), at the facility meter. Prices from the cluster spec: "
              f"{_all_prices(c for _, c in priced)}. Energy {priced[0][1]['energy_source']}. '-': the spec lacks that "
              "price.")
    for line in notes:
        print(f"note: {line}")


def _all_prices(costs: Any) -> str:
    """Every node group's prices that some ranked strategy uses, once each, in order of first use: a strategy with
    another group's devices (``--devices auto``) is priced with that group's figures too."""
    groups: list[str] = []
    for c in costs:
        for group in str(c["prices"]).split("; "):
            if group not in groups:
                groups.append(group)
    return "; ".join(groups)
