"""A change to a cluster (``ampe replan --without/--add/--slow``) as a new cluster spec: the old spec with devices
marked ``down``, stragglers marked in ``stragglers`` and node groups added (or brought back), so the cluster as it
now is stays one YAML file that every command reads (docs/replan.md).

Devices are named as the spec and the plan name them: a node (``p3-1``), a device id of the plan (``17``) or a
device of a node (``p3-1:2``: the node and the device's index inside it, which stays the same when other devices
go down, unlike the id).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ampe.costmodel.cluster import MAX_SLOWDOWN, Cluster, cluster_from_dict
from ampe.errors import InputError
from ampe.io import read_yaml
from ampe.parsers import parse_index


@dataclass(frozen=True)
class ClusterChange:
    """What changed: devices gone, a spec fragment of node groups added or back, stragglers (factor > 1: slower)."""

    without: tuple[str, ...] = ()  # node names, device ids of the plan, or node:index
    add: str | None = None  # path of a spec fragment with `nodes:` (and optionally `gpu_types:`, `links:`)
    slow: tuple[tuple[str, float], ...] = ()  # (device or node, compute-time factor ≥ 1; 1 = healthy again)

    @property
    def empty(self) -> bool:
        """Whether nothing changes."""
        return not (self.without or self.add or self.slow)


def parse_without(text: str) -> tuple[str, ...]:
    """``--without`` (comma-separated node names, device ids or node:index); InputError on an empty item."""
    items = tuple(t.strip() for t in text.split(","))
    if not text.strip() or any(not t for t in items):
        raise InputError("--without", "", f"{text!r}: give node names, device ids or node:index, comma-separated "
                         "(e.g. p3-1,17)")
    return items


def parse_slow(text: str) -> tuple[tuple[str, float], ...]:
    """``--slow DEVICE=FACTOR[,...]``: FACTOR is how many times longer the device's compute takes (2 = half speed;
    1 = healthy again), 1..MAX_SLOWDOWN; InputError otherwise."""
    out = []
    for item in text.split(","):
        ref, eq, factor = item.strip().partition("=")
        try:
            f = float(factor)
        except ValueError:
            f = math.nan
        if not eq or not ref.strip():
            raise InputError("--slow", "", f"{item.strip()!r}: expected DEVICE=FACTOR, e.g. 17=2 (device 17 computes "
                             "at half speed) or p3-1:2=1.5")
        if not (math.isfinite(f) and 1 <= f <= MAX_SLOWDOWN):
            raise InputError("--slow", "", f"{item.strip()!r}: FACTOR is how many times longer the device's compute "
                             f"takes, 1..{MAX_SLOWDOWN:g} (2 = half speed, 1 = healthy again)")
        out.append((ref.strip(), f))
    return tuple(out)


def node_ref(cluster: Cluster, ref: str, flag: str) -> str:
    """A spec reference (``node`` or ``node:index``) for a device id of ``cluster`` or a node or node:index of it;
    InputError naming ``flag`` when the cluster has no such device or node."""
    number = parse_index(ref)
    if number is not None:
        if number >= cluster.size:
            raise InputError(flag, "", f"{ref}: no device {ref} (the plan's devices are 0..{cluster.size - 1})")
        d = cluster.devices[number]
        return f"{d.node}:{d.local_index}"
    node, colon, local = ref.partition(":")
    if node not in cluster.nodes:
        near = ", ".join(cluster.nodes[:8]) + (", ..." if len(cluster.nodes) > 8 else "")
        raise InputError(flag, "", f"{ref!r}: no node {node!r} in the plan's cluster (nodes: {near})")
    if colon:
        here = sorted(d.local_index for d in cluster.devices if d.node == node)
        if parse_index(local) not in here:
            raise InputError(flag, "", f"{ref!r}: node {node} has devices :{', :'.join(map(str, here))}")
    return ref


def changed_spec(raw: dict[str, Any], cluster: Cluster, change: ClusterChange) -> dict[str, Any]:
    """The spec ``raw`` (that ``cluster`` was loaded from) after ``change``; raises InputError (flag or fragment
    file, field) for devices the cluster does not have, a fragment's bad node group, or nothing left."""
    new = dict(raw)
    down = list(raw.get("down") or [])
    gone: set[int] = set()
    for ref in change.without:
        r = node_ref(cluster, ref, "--without")
        node, _, local = r.partition(":")
        k = parse_index(local)
        gone.update(d.id for d in cluster.devices if d.node == node and (not local or d.local_index == k))
        if r not in down:
            down.append(r)
    if len(gone) == cluster.size:
        raise InputError("--without", "", f"{','.join(change.without)} is every device of the cluster: nothing "
                         "left to plan for")
    stragglers = dict(raw.get("stragglers") or {})
    for ref, factor in change.slow:
        _slow(stragglers, cluster, node_ref(cluster, ref, "--slow"), factor)
    if change.add:
        down = _add(new, down, stragglers, change.add)
    new["down"] = down
    new["stragglers"] = stragglers
    for key in ("down", "stragglers"):
        if not new[key]:
            del new[key]
    return new


def _slow(stragglers: dict[str, float], cluster: Cluster, ref: str, factor: float) -> None:
    """Set straggler ``ref`` (``node`` or ``node:index``) to ``factor`` in ``stragglers`` (1: healthy, the entry goes).
    A device of a node that is slow as a whole gets its own entry, its siblings keep the node's factor (so
    ``--slow p3-1:0=1`` heals that device alone); a node given as a whole drops its devices' own entries."""
    node, colon, _ = ref.partition(":")
    if colon and node in stragglers:
        whole = stragglers.pop(node)
        for d in cluster.devices:
            if d.node == node:
                stragglers.setdefault(f"{node}:{d.local_index}", whole)
    if not colon:
        for key in [k for k in stragglers if k.partition(":")[0] == node]:
            del stragglers[key]
    if factor == 1:
        stragglers.pop(ref, None)
    else:
        stragglers[ref] = factor


def _add(new: dict[str, Any], down: list[str], stragglers: dict[str, float], path: str) -> list[str]:
    """Merge the fragment at ``path`` into ``new`` (nodes appended, or back where all their nodes are down);
    returns the ``down`` list without the nodes that came back."""
    frag = read_yaml(path)
    if not isinstance(frag, dict) or not isinstance(frag.get("nodes"), list):
        raise InputError(path, "nodes", "a fragment to add must be a mapping with a `nodes:` list (node groups, as "
                         "in a cluster spec)")
    extra = set(frag) - {"nodes", "gpu_types", "links"}
    if extra:
        raise InputError(path, sorted(extra)[0], "a fragment to add may give nodes, gpu_types and links only")
    # validated on its own first, so errors name the fragment's own fields
    part = cluster_from_dict({"name": "added", "nodes": frag["nodes"], "gpu_types": frag.get("gpu_types") or {},
                              "latency_us": new.get("latency_us", 10.0)}, path)
    old = cluster_from_dict({k: v for k, v in new.items() if k not in ("down", "stragglers")}, "(old spec)")
    gone = {r for r in down if ":" not in r}
    nodes = list(new.get("nodes") or [])
    for i, group in enumerate(frag["nodes"]):
        expanded = [d for d in part.nodes if _group_of(group, d)]
        single = str(group.get("name")) if int(group.get("repeat", 1)) == 1 else None
        # a group of one node named as the cluster names a node (`p3-1`) is that node
        names = [single] if single in old.nodes else expanded
        own = dict(zip(names, expanded, strict=True))
        known = [n for n in names if n in old.nodes]
        if not known:
            nodes.append(group)
            continue
        if len(known) < len(names):
            raise InputError(path, f"nodes[{i}].name", f"{', '.join(known)} are in the cluster already but "
                             f"{', '.join(n for n in names if n not in known)} are not: add new nodes in a group of "
                             "their own")
        for n in known:
            up = [r for r in down if r.partition(":")[0] == n]
            if n not in gone and not up:
                raise InputError(path, f"nodes[{i}].name", f"node {n} is in the cluster and not down")
            was = old.node_devices()[n]
            now = part.node_devices()[own[n]]
            if len(was) != len(now) or old.devices[was[0]].gpu.name != part.devices[now[0]].gpu.name:
                raise InputError(path, f"nodes[{i}]", f"node {n} was {len(was)}×{old.devices[was[0]].gpu.name}; "
                                 "a node back must be what it was (give a new name for another node)")
            down = [r for r in down if r.partition(":")[0] != n]
            for ref in [r for r in stragglers if r.partition(":")[0] == n]:
                del stragglers[ref]  # a node back is healthy unless --slow says otherwise
    types = dict(new.get("gpu_types") or {})
    in_use = {d.gpu.name for d in old.devices}
    for name, spec in (frag.get("gpu_types") or {}).items():
        if name in types and types[name] != spec:
            raise InputError(path, f"gpu_types.{name}", "differs from the cluster spec's type of that name")
        if name in in_use and name not in types:  # it would redefine the type the cluster's own nodes run
            raise InputError(path, f"gpu_types.{name}", f"the cluster's nodes already use GPU type {name}; a fragment "
                             "may define new types only (give this one another name)")
        types[name] = spec
    if types:
        new["gpu_types"] = types
    if frag.get("links"):
        new["links"] = list(new.get("links") or []) + list(frag["links"])
    new["nodes"] = nodes
    return down


def _group_of(group: Any, node: str) -> bool:
    """Whether expanded node name ``node`` comes from the spec node group ``group``."""
    name = str(group.get("name", "")) if isinstance(group, dict) else ""
    return node.rpartition("-")[0] == name


def device_map(old: Cluster, new: Cluster) -> dict[int, int]:
    """Device id in ``old`` → id in ``new`` of every device both have (same node, same index inside it)."""
    where = {(d.node, d.local_index): d.id for d in new.devices}
    return {d.id: where[(d.node, d.local_index)] for d in old.devices if (d.node, d.local_index) in where}
