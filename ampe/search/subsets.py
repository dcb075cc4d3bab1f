"""Searching parts of the cluster (``ampe search --devices auto``): the whole cluster, the cluster without each
GPU-type group (when it has several) and without one node of each kind (small clusters), ranked together.

Every strategy found on a part is re-costed on the whole cluster with its placement naming the devices it uses (the
others stay idle and draw nothing from the job: they are free for other work), so times, memory and energy are on
one table. The placement name says what was left out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from ampe.costmodel.cluster import Cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.model import Model
from ampe.costmodel.profile import Profile
from ampe.search.engine import Candidate, SearchOptions, SearchResult, _dedupe, _rank_key, search

DEVICE_MODES = ("all", "auto")


MAX_NODES_LEFT_OUT = 8  # above this many nodes only GPU-type groups are left out (each node would be a search)


def device_subsets(cluster: Cluster) -> list[tuple[str, tuple[int, ...]]]:
    """(what is left out, device ids kept) for every part ``--devices auto`` searches: the whole cluster (""); with
    several GPU types, the cluster without each type's devices; and, for clusters of 2..MAX_NODES_LEFT_OUT nodes,
    the cluster without one node — one node per kind (GPU type, GPU count, links to the rest and network
    interfaces), since leaving out either of two identical nodes gives the same cluster."""
    out: list[tuple[str, tuple[int, ...]]] = [("", tuple(range(cluster.size)))]
    seen = {out[0][1]}
    types = cluster.gpu_types()
    if len(types) > 1:
        for g in types:
            left = [d.id for d in cluster.devices if d.gpu.name == g.name]
            kept = tuple(d.id for d in cluster.devices if d.gpu.name != g.name)
            out.append((f"without {len(left)}×{g.name}", kept))
            seen.add(kept)
    nodes = cluster.node_devices()
    if 2 <= len(nodes) <= MAX_NODES_LEFT_OUT:
        kinds: set[tuple] = set()
        for name, ids in nodes.items():
            others = [d.id for d in cluster.devices if d.id not in ids]
            links = tuple(sorted({float(cluster.bandwidth[ids[0], o]) for o in others}))
            nics = len(set(cluster.bandwidth.nics()[ids].tolist()))  # network interfaces: shared by fewer devices
            kind = (cluster.devices[ids[0]].gpu.name, len(ids), links, nics)
            kept = tuple(others)
            if kind in kinds or kept in seen or not kept:
                continue
            kinds.add(kind)
            seen.add(kept)
            out.append((f"without node {name} ({len(ids)}×{cluster.devices[ids[0]].gpu.name})", kept))
    return out


def search_devices(cluster: Cluster, model: Model, profile: Profile | None, opts: SearchOptions,
                   progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """Search the whole cluster and every part of :func:`device_subsets`; one ranking, fastest first."""
    t0 = time.perf_counter()
    cm = CostModel(cluster, model, profile)
    found: list[Candidate] = []
    total = pruned = degrees = 0
    oom: list[str] = []
    for label, ids in device_subsets(cluster):
        part = cluster if not label else cluster.subset(ids, f"{cluster.name} {label}")
        try:
            res = search(part, model, profile, opts, progress if not label else None)
        except ValueError:  # no layout of this part (e.g. fewer devices than a node's tp needs)
            continue
        total += res.candidates
        pruned += res.pruned_oom
        degrees += res.degrees
        oom += [f"{o} ({label})" if label else o for o in res.oom_examples]
        for c in res.ranked:
            if not label:
                found.append(c)
                continue
            s = c.strategy
            assert s.placement is not None
            est = cm.estimate(replace(s, placement=tuple(ids[d] for d in s.placement)), opts.method)
            found.append(Candidate(est, f"{c.placement_name}, {label}"))
    ranked = sorted(_dedupe(found), key=_rank_key)
    return SearchResult(tuple(ranked), total, pruned, time.perf_counter() - t0, degrees, tuple(oom[:3]))


def left_out(cluster: Cluster, placement: tuple[int, ...] | list[int]) -> str:
    """Devices a placement leaves out, by GPU type (``8×A40``), or "" when it uses them all."""
    used = set(placement)
    counts: dict[str, int] = {}
    for d in cluster.devices:
        if d.id not in used:
            counts[d.gpu.name] = counts.get(d.gpu.name, 0) + 1
    return ", ".join(f"{n}×{g}" for g, n in counts.items())
