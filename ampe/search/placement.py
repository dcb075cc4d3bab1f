"""Placement candidates: which device runs each global rank.

A placement is built from a *device order* and a *layout*:

* layouts — ``megatron``: ranks fill the order with tp innermost, then dp, then pp (rank = j·dp·tp + r·tp + k), so a
  stage's dp·tp devices are consecutive in the order; ``pipeline-inner``: each data-parallel replica takes a
  consecutive block of pp·tp devices, so a whole pipeline sits together and data-parallel rings cross blocks;
* device orders — ``given`` (spec order); ``fast-first`` / ``slow-first`` (nodes grouped by GPU type, fastest or
  slowest type first, so stages — or replicas — are type-homogeneous and the exact DP gives slow stages fewer
  layers); ``bandwidth`` (nodes chained greedily along their fastest links, so the slow links end up between
  consecutive stages, carrying pipeline transfers instead of tensor- or data-parallel traffic).

Tensor-parallel groups stay on one node whenever the order keeps nodes whole and tp divides the node size.
A local search (:func:`neighbours`) swaps the device blocks of two stages, for refining the best candidates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from ampe.costmodel.cluster import Cluster

ORDERS = ("given", "fast-first", "slow-first", "bandwidth")
LAYOUTS = ("megatron", "pipeline-inner")


@dataclass(frozen=True)
class Placement:
    """Device id per global rank, and how it was made."""

    devices: tuple[int, ...]
    name: str


def node_order(cluster: Cluster, order: str, slowness: Callable[[str], float]) -> list[str]:
    """Node names in the requested order (see module docstring)."""
    nodes = list(cluster.nodes)
    first_dev = {n: devs[0] for n, devs in cluster.node_devices().items() if devs}
    if order == "given":
        return nodes
    if order in ("fast-first", "slow-first"):
        sign = 1 if order == "slow-first" else -1
        pos = {n: i for i, n in enumerate(nodes)}
        return sorted(nodes, key=lambda n: (sign * slowness(cluster.devices[first_dev[n]].gpu.name), pos[n]))
    if order == "bandwidth":
        return _bandwidth_chain(cluster, nodes, first_dev, slowness)
    raise ValueError(f"unknown device order {order!r}")


def _bandwidth_chain(cluster: Cluster, nodes: list[str], first_dev: dict[str, int],
                     slowness: Callable[[str], float]) -> list[str]:
    """Greedy path through the nodes that always takes the fastest link next (ties: same GPU type, spec order)."""
    if len(nodes) <= 2:
        return nodes
    bw = cluster.bandwidth
    # start from a node on the slowest type so the chain groups types and ends at the slow link
    start = max(range(len(nodes)), key=lambda i: (slowness(cluster.devices[first_dev[nodes[i]]].gpu.name), -i))
    first = np.array([first_dev[n] for n in nodes])
    type_of = [cluster.devices[d].gpu.name for d in first]
    code = np.array([type_of.index(t) for t in type_of])  # GPU type as an int (first node of that type)
    left = np.ones(len(nodes), dtype=bool)
    left[start] = False
    chain = [start]
    while left.any():
        cand = np.flatnonzero(left)  # in spec order
        links = bw[first[chain[-1]], first[cand]]
        best = cand[links == links.max()]  # fastest link; then the same GPU type; then the spec order
        same = best[code[best] == code[chain[-1]]]
        nxt = int(same[0] if len(same) else best[0])
        chain.append(nxt)
        left[nxt] = False
    return [nodes[i] for i in chain]


def device_order(cluster: Cluster, order: str, slowness: Callable[[str], float]) -> list[int]:
    """Device ids with whole nodes in :func:`node_order`."""
    per_node = cluster.node_devices()
    return [d for n in node_order(cluster, order, slowness) for d in per_node[n]]


def layout(devices: list[int], pp: int, dp: int, tp: int, kind: str) -> tuple[int, ...]:
    """Map an ordered device list onto ranks (rank = j·dp·tp + r·tp + k)."""
    arr = np.asarray(devices)
    if kind == "megatron":
        return tuple(arr.tolist())
    if kind == "pipeline-inner":
        # replica r's pipeline is the block r·pp·tp .. (r+1)·pp·tp of the order: rank (j, r, k) ← order (r, j, k)
        return tuple(arr.reshape(dp, pp, tp).transpose(1, 0, 2).reshape(-1).tolist())
    raise ValueError(f"unknown layout {kind!r}")


def device_orders(cluster: Cluster, slowness: Callable[[str], float],
                  orders: tuple[str, ...] = ORDERS) -> dict[str, list[int]]:
    """:func:`device_order` of each order that :func:`candidates` uses (they do not depend on the degrees: compute
    them once per search)."""
    one_type = len(cluster.gpu_types()) == 1
    return {o: device_order(cluster, o, slowness) for o in orders
            if not (one_type and o in ("fast-first", "slow-first"))}


def candidates(cluster: Cluster, pp: int, dp: int, tp: int, slowness: Callable[[str], float],
               orders: tuple[str, ...] = ORDERS, layouts: tuple[str, ...] = LAYOUTS,
               orders_made: dict[str, list[int]] | None = None) -> list[Placement]:
    """Distinct placements for (pp, dp, tp); the Megatron order of the spec comes first. ``orders_made``: the
    :func:`device_orders` of ``orders``, when the caller keeps them."""
    seen: dict[tuple[int, ...], Placement] = {}
    made = orders_made if orders_made is not None else device_orders(cluster, slowness, orders)
    for lay in layouts:
        if lay == "pipeline-inner" and (pp == 1 or dp == 1):
            continue  # identical to megatron
        for order in orders:
            if order not in made:  # fast-first / slow-first on one GPU type
                continue
            devs = layout(made[order], pp, dp, tp, lay)
            if devs not in seen:
                seen[devs] = Placement(devs, f"{lay}/{order}")
    return list(seen.values())


def neighbours(p: Placement, pp: int, dp: int, tp: int) -> Iterator[Placement]:
    """Placements that swap the device blocks (all dp·tp devices) of two pipeline stages."""
    for _, _, nb in swaps(p, pp, dp, tp):
        yield nb


def swaps(p: Placement, pp: int, dp: int, tp: int) -> Iterator[tuple[int, int, Placement]]:
    """:func:`neighbours` with the two stages a < b each one swaps, in the same order."""
    block = dp * tp
    devs = list(p.devices)
    for a in range(pp):
        for b in range(a + 1, pp):
            new = list(devs)
            new[a * block:(a + 1) * block], new[b * block:(b + 1) * block] = (devs[b * block:(b + 1) * block],
                                                                              devs[a * block:(a + 1) * block])
            yield a, b, Placement(tuple(new), f"{p.name}+swap{a}-{b}")


def stage_labels(cluster: Cluster, devices: tuple[int, ...], pp: int, dp: int, tp: int) -> list[str]:
    """Each stage's devices by GPU type, e.g. ``V100-16GB×4`` or ``T4×1+V100-16GB×1`` (a stage mixing types)."""
    block = dp * tp
    parts = []
    for j in range(pp):
        counts: dict[str, int] = {}
        for d in devices[j * block:(j + 1) * block]:
            name = cluster.devices[d].gpu.name
            counts[name] = counts.get(name, 0) + 1
        parts.append("+".join(f"{k}×{v}" for k, v in counts.items()))
    return parts


def summary(cluster: Cluster, devices: tuple[int, ...], pp: int, dp: int, tp: int) -> str:
    """Short text: GPU types per stage, every stage, e.g. ``V100-16GB×4 | V100-16GB×4 | T4×4`` (the plan's
    ``placement_summary``; :func:`compact_summary` is the tables' shorter form)."""
    return " | ".join(stage_labels(cluster, devices, pp, dp, tp))


def compact_summary(cluster: Cluster, devices: tuple[int, ...], pp: int, dp: int, tp: int) -> str:
    """GPU type per stage, runs of equal consecutive stages counted: ``V100-16GB | T4 | V100-16GB ×2``.

    Every stage holds dp·tp devices, so a stage of one type is named by the type alone; a stage mixing types keeps
    its counts (``(T4×1+V100-16GB×1) ×4``: four such stages in a row). Nothing is cut: a 16-stage pipeline over two
    types is ``T4 ×4 | V100-16GB ×12``."""
    labels = [label.split("×")[0] if "+" not in label else label
              for label in stage_labels(cluster, devices, pp, dp, tp)]
    runs: list[list] = []
    for label in labels:
        if runs and runs[-1][0] == label:
            runs[-1][1] += 1
        else:
            runs.append([label, 1])
    return " | ".join(label if n == 1 else (f"({label}) ×{n}" if "+" in label else f"{label} ×{n}")
                      for label, n in runs)
