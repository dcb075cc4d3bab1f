"""Cluster specs (YAML) → :class:`Cluster`: devices plus their bandwidth by link class (:mod:`ampe.costmodel.links`).

Spec keys (see ``docs/reference/cluster_spec.md``)::

    name: amp-het-cluster
    latency_us: 10                   # optional, per message, default 10
    nodes:
      - {name: p3, gpu: V100-16GB, count: 4, intra_gbps: 170, inter_gbps: 10, repeat: 3}
      - {name: g4, gpu: T4, count: 4, intra_gbps: 50, inter_gbps: 50}
    links:                           # optional node-pair overrides
      - {a: p3-0, b: g4-0, gbps: 10}
    bandwidth_matrix_gbps: [[...]]   # optional full device-level matrix (diagonal ignored)
    gpu_types: {}                    # optional catalog additions/overrides (incl. `dvfs:`, docs/energy.md §1)
    currency: USD                    # optional prices and site figures (ampe.costmodel.pricing): nodes[] and
    electricity_per_kwh: 0.12        # gpu_types.<T> take price_per_hour; nodes[] and the top level take
    carbon_g_per_kwh: 380            # electricity_per_kwh, carbon_g_per_kwh and pue

Every node spec expands to ``repeat`` nodes named ``<name>-0``, ``<name>-1``, … (a node without ``repeat`` is
``<name>-0`` and may be named plainly in ``links``). Bandwidth between devices of one node is that node's
``intra_gbps``; between nodes it is
``min(inter_a, inter_b)`` unless ``links`` overrides it; ``bandwidth_matrix_gbps`` overrides everything.
Devices get global ids in node order. Units in :class:`Cluster` are bytes/s and seconds. The bandwidth is kept per
node and per override (:class:`LinkBandwidth`), not as a dense device×device matrix: 16,384 devices take a few
hundred KB, not 2 GiB.

A node may say ``processors: P`` when its ``count`` devices time-share P processors (CPU emulation: 4 trial ranks on
2 cores); device k of the node runs on processor k mod P, as the trial worker pins it. The cost model then also
bounds the iteration by the busiest processor's total work (``docs/fidelity.md``). ``sharing_efficiency: e`` (default 1)
is the share of a processor's throughput that its time-sharing ranks keep together, as ``ampe profile --sharing``
measures it (cache and scheduler losses): two ranks on one processor each run at e/2 of its speed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, ValidationError, field_validator

from ampe.costmodel.catalog import CATALOG, GpuType, get_gpu_type
from ampe.costmodel.gpu_spec import GpuTypeSpec, build_gpu_type
from ampe.costmodel.links import LinkBandwidth
from ampe.costmodel.pricing import DevicePrice, Pricing
from ampe.costmodel.spec_base import (
    CarbonIntensity,
    EnergyPrice,
    Gbps,
    Microseconds,
    PricePerHour,
    PrintableName,
    Pue,
    ReferenceName,
    SpecModel,
)
from ampe.errors import InputError, from_pydantic, suggest
from ampe.io import read_yaml
from ampe.parsers import parse_index
from ampe.plausible import BANDWIDTH_GBPS

GBPS = 1e9 / 8  # bytes/s per Gbit/s
MAX_DEVICES = 16384  # the largest cluster ampe plans for (docs/cost_model.md, "Costing at scale")
MAX_SLOWDOWN = 1000.0  # a straggler's largest compute-time factor


@dataclass(frozen=True)
class Device:
    """One accelerator: global id, node name, index inside the node, and its type."""

    id: int
    node: str
    local_index: int
    gpu: GpuType


@dataclass(frozen=True, eq=False)
class Cluster:
    """Devices and the bandwidth between any two (bytes/s; inf from a device to itself; ``bandwidth[a, b]`` with
    integers or integer arrays, as a symmetric matrix would answer)."""

    name: str
    devices: tuple[Device, ...]
    bandwidth: LinkBandwidth
    latency_s: float = 1e-5
    nodes: tuple[str, ...] = field(default=())
    source: str = ""
    # Processor each device runs on, when some devices time-share one (a node's `processors:`); None otherwise.
    processor: tuple[int, ...] | None = None
    # Per processor (indexed like `processor`'s values): throughput kept when several devices time-share it
    # (a node's `sharing_efficiency`); None when no processor is shared.
    processor_efficiency: tuple[float, ...] | None = None
    # What each device costs and emits (the spec's price_per_hour, electricity_per_kwh, carbon_g_per_kwh, pue);
    # None when the spec gives none of them.
    pricing: Pricing | None = None

    @property
    def size(self) -> int:
        """Number of devices."""
        return len(self.devices)

    def gpu_types(self) -> tuple[GpuType, ...]:
        """Distinct device types, in order of first appearance."""
        return self._gpu_types

    @cached_property
    def _gpu_types(self) -> tuple[GpuType, ...]:
        """:meth:`gpu_types`, found once (the devices never change; 16,384 of them at most)."""
        seen: dict[str, GpuType] = {}
        for d in self.devices:
            seen.setdefault(d.gpu.name, d.gpu)
        return tuple(seen.values())

    def node_devices(self) -> dict[str, list[int]]:
        """Device ids per node name, in node order."""
        out: dict[str, list[int]] = {n: [] for n in self.nodes}
        for d in self.devices:
            out.setdefault(d.node, []).append(d.id)
        return out

    def subset(self, ids: Sequence[int], name: str | None = None) -> Cluster:
        """The cluster of devices ``ids`` only (renumbered 0..len(ids)−1 in the order given; bandwidths, nodes and
        shared processors kept): what ``ampe search --devices auto`` searches when it leaves devices out."""
        idx = list(ids)
        devices = tuple(Device(k, self.devices[d].node, self.devices[d].local_index, self.devices[d].gpu)
                        for k, d in enumerate(idx))
        bw = self.bandwidth.subset(idx)
        used = {d.node for d in devices}
        nodes = tuple(n for n in self.nodes if n in used)
        proc = tuple(self.processor[d] for d in idx) if self.processor is not None else None
        prices = self.pricing.subset(idx) if self.pricing is not None else None
        return replace(self, name=name or self.name, devices=devices, bandwidth=bw, nodes=nodes, processor=proc,
                       pricing=prices)

    def link(self, a: int, b: int) -> float:
        """Bandwidth between devices ``a`` and ``b`` in bytes/s (inf when a == b)."""
        return float(self.bandwidth.pairs(a, b))


# ---------------------------------------------------------------------------------------------------------------
# Spec schema (pydantic, only at the I/O edge)


class _NodeSpec(SpecModel):
    name: ReferenceName = Field(min_length=1, max_length=128)
    gpu: str = Field(min_length=1)
    count: int = Field(ge=1, le=4096)
    intra_gbps: Gbps
    inter_gbps: Gbps
    repeat: int = Field(default=1, ge=1, le=100000)
    # Network interfaces of the node, each of inter_gbps (device k uses interface k·nics // count): the node's
    # devices share them for inter-node traffic. Absent: one, shared by all of the node's devices.
    nics: int | None = Field(default=None, ge=1)
    # Devices of this node time-share this many processors (device k of the node runs on processor k mod
    # processors): CPU emulation, e.g. 4 trial ranks on a 2-core machine. Absent: every device is its own.
    processors: int | None = Field(default=None, ge=1)
    # Throughput share a processor keeps when its devices time-share it (measured by `ampe profile --sharing`).
    sharing_efficiency: float = Field(default=1.0, gt=0, le=1)
    # Prices (ampe.costmodel.pricing): per GPU-hour (overrides gpu_types.<T>.price_per_hour) and the site's figures
    # (override the top-level ones).
    price_per_hour: PricePerHour | None = None
    electricity_per_kwh: EnergyPrice | None = None
    carbon_g_per_kwh: CarbonIntensity | None = None
    pue: Pue | None = None

    @field_validator("intra_gbps", "inter_gbps")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @field_validator("processors")
    @classmethod
    def _share_not_split(cls, v: int | None, info: Any) -> int | None:
        count = info.data.get("count")
        if v is not None and count is not None and v > count:
            raise ValueError(f"{v} processors for {count} devices: devices can share processors, not split them")
        return v

    @field_validator("sharing_efficiency")
    @classmethod
    def _only_when_shared(cls, v: float, info: Any) -> float:
        if v != 1.0 and "processors" in info.data and info.data["processors"] is None:
            raise ValueError("only means something with `processors:` (devices time-sharing fewer processors)")
        return v


class _LinkSpec(SpecModel):
    a: str
    b: str
    gbps: Gbps

    @field_validator("gbps")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v


class _ClusterSpec(SpecModel):
    name: PrintableName = Field(min_length=1, max_length=256)
    nodes: list[_NodeSpec] = Field(min_length=1, fail_fast=True)
    links: list[_LinkSpec] = Field(default_factory=list, fail_fast=True)
    bandwidth_matrix_gbps: list[list[float]] | None = Field(default=None, fail_fast=True)
    gpu_types: dict[PrintableName, GpuTypeSpec] = Field(default_factory=dict)
    latency_us: Microseconds = 10.0
    description: str | None = None
    currency: PrintableName | None = Field(default=None, min_length=1, max_length=16)  # a label for the prices
    electricity_per_kwh: EnergyPrice | None = None  # defaults for every node group
    carbon_g_per_kwh: CarbonIntensity | None = None
    pue: Pue | None = None
    # The cluster as it now is (``ampe replan`` writes these): nodes (``p3-1``) or devices (``p3-1:2``, node and
    # index inside it) that are out, and stragglers: device or node → compute-time factor (2 = twice as slow).
    down: list[str] = Field(default_factory=list)
    stragglers: dict[str, float] = Field(default_factory=dict)

    @field_validator("nodes")
    @classmethod
    def _plannable(cls, v: list[_NodeSpec]) -> list[_NodeSpec]:
        total = sum(node.count * node.repeat for node in v)
        if total > MAX_DEVICES:
            raise ValueError(f"{total} devices is more than ampe plans for ({MAX_DEVICES}; "
                             "ampe.costmodel.cluster.MAX_DEVICES)")
        return v

    @field_validator("stragglers")
    @classmethod
    def _factors(cls, v: dict[str, float]) -> dict[str, float]:
        for ref, f in v.items():
            if not (math.isfinite(f) and 1 <= f <= MAX_SLOWDOWN):
                raise ValueError(f"{ref}: a straggler's factor is how many times longer its compute takes, "
                                 f"1..{MAX_SLOWDOWN:g} (1 = healthy), got {f}")
        return v


def load_cluster(path: str | Path) -> Cluster:
    """Load a cluster spec YAML file. Raises :class:`InputError` (file + field) on any bad input."""
    path = Path(path)
    return cluster_from_dict(read_yaml(path), str(path))


def cluster_from_dict(raw: Any, source: str = "<spec>") -> Cluster:
    """Validate a parsed spec and expand it into devices and their bandwidth by link class.

    Args:
        raw: the parsed YAML (a mapping with ``name`` and ``nodes``).
        source: the file name errors name.

    Returns:
        The cluster (bandwidth in bytes/s, latency in s), down devices left out.
    """
    if not isinstance(raw, dict):
        raise InputError(source, "(root)", "a cluster spec must be a mapping with `name` and `nodes`")
    try:
        spec = _ClusterSpec.model_validate(raw)
    except ValidationError as e:
        raise from_pydantic(source, e, _ClusterSpec) from None
    # an entry giving only a price keeps the catalog type as it is (no variant of it)
    extra_types = {n: build_gpu_type(source, n, t) for n, t in spec.gpu_types.items()
                   if t.model_fields_set - {"price_per_hour"} or n not in CATALOG}
    layout = _expand_nodes(spec, extra_types, source)
    index = _node_index(spec, layout.node_names)
    bw = _bandwidth(spec, layout, index, source)
    devices = layout.devices
    if spec.stragglers:
        devices = _with_stragglers(devices, spec.stragglers, index, layout.node_names, source)
    shared = len(set(layout.processor_of)) < len(layout.processor_of)
    cluster = Cluster(
        name=spec.name,
        devices=tuple(devices),
        bandwidth=bw,
        latency_s=spec.latency_us * 1e-6,
        nodes=tuple(layout.node_names),
        source=source,
        processor=tuple(layout.processor_of) if shared else None,
        processor_efficiency=tuple(layout.efficiency_of) if shared else None,
        pricing=_pricing(spec, source, layout.node_group),
    )
    return _without_down(cluster, spec.down, index, source)


@dataclass
class _Layout:
    """The spec's node entries expanded: devices in id order and, per device, its node, node entry and processor;
    per node its bandwidth (bytes/s); per processor its sharing efficiency."""

    devices: list[Device] = field(default_factory=list)
    node_names: list[str] = field(default_factory=list)
    node_of_device: list[int] = field(default_factory=list)
    node_group: list[int] = field(default_factory=list)  # per device: its entry in `nodes`
    processor_of: list[int] = field(default_factory=list)
    efficiency_of: list[float] = field(default_factory=list)  # per processor
    node_intra: list[float] = field(default_factory=list)
    node_inter: list[float] = field(default_factory=list)


def _expand_nodes(spec: _ClusterSpec, extra_types: dict[str, GpuType], source: str) -> _Layout:
    """Every node entry repeated and its devices numbered in node order (unknown GPU types and duplicate node names
    refused)."""
    out = _Layout()
    next_processor = 0
    for i, node in enumerate(spec.nodes):
        gpu = get_gpu_type(node.gpu, extra_types)
        if gpu is None:
            known = ", ".join(sorted(set(CATALOG) | set(extra_types)))
            close = suggest(node.gpu, [*CATALOG, *extra_types])
            raise InputError(source, f"nodes[{i}].gpu", f"unknown GPU type {node.gpu!r}"
                             + (f" (did you mean {close}?)" if close else "") + f"; known: {known}")
        for r in range(node.repeat):
            nname = f"{node.name}-{r}"
            if nname in out.node_names:
                raise InputError(source, f"nodes[{i}].name", f"duplicate node name {nname!r}")
            out.node_names.append(nname)
            out.node_intra.append(node.intra_gbps * GBPS)
            out.node_inter.append(node.inter_gbps * GBPS)
            for k in range(node.count):
                out.devices.append(Device(len(out.devices), nname, k, gpu))
                out.node_group.append(i)
                out.node_of_device.append(len(out.node_names) - 1)
                out.processor_of.append(next_processor + (k % node.processors if node.processors else k))
            next_processor += node.processors or node.count
            out.efficiency_of.extend([node.sharing_efficiency] * (node.processors or node.count))
    return out


def _node_index(spec: _ClusterSpec, node_names: list[str]) -> dict[str, int]:
    """Node name → its position; a node without ``repeat`` may also be named without its "-0" suffix."""
    index = {name: k for k, name in enumerate(node_names)}
    for node in spec.nodes:
        if node.repeat == 1:
            index.setdefault(node.name, index[f"{node.name}-0"])
    return index


def _bandwidth(spec: _ClusterSpec, layout: _Layout, index: dict[str, int], source: str) -> LinkBandwidth:
    """Node-level bandwidth, then node-pair overrides (the last one given for a pair wins), or a device-level
    matrix."""
    nn = len(layout.node_names)
    overrides: dict[tuple[int, int], float] = {}
    for j, link in enumerate(spec.links):
        for end in ("a", "b"):
            if getattr(link, end) not in index:
                raise InputError(source, f"links[{j}].{end}",
                                 f"unknown node {getattr(link, end)!r} (nodes: {', '.join(layout.node_names[:8])}"
                                 + (", ..." if nn > 8 else "") + ")")
        a, b = index[link.a], index[link.b]
        overrides.pop((b, a), None)
        overrides[(a, b)] = link.gbps * GBPS
    nod = np.asarray(layout.node_of_device, dtype=np.int64)
    nics = _interfaces(spec, source)
    bw = LinkBandwidth.of_nodes(nod, np.asarray(layout.node_intra), np.asarray(layout.node_inter), overrides, nics)
    if spec.bandwidth_matrix_gbps is None:
        return bw
    m = _checked_matrix(spec.bandwidth_matrix_gbps, len(layout.devices), source)
    return LinkBandwidth.of_matrix(m * GBPS, nod, nics)


def _checked_matrix(mat: list[list[float]], n: int, source: str) -> np.ndarray:
    """``bandwidth_matrix_gbps`` as an n×n array (Gbit/s), refused unless square, plausible off the diagonal and
    symmetric (the field names the first bad entry)."""
    if len(mat) != n or any(len(row) != n for row in mat):
        bad = next((k for k, row in enumerate(mat) if len(row) != n), None)
        field = "bandwidth_matrix_gbps" if bad is None or len(mat) != n else f"bandwidth_matrix_gbps[{bad}]"
        raise InputError(source, field, f"must be {n}×{n} (one row and column per GPU), got "
                         f"{len(mat)} rows" + ("" if bad is None else f", row {bad} has {len(mat[bad])} entries"))
    m = np.asarray(mat, dtype=float)
    off = ~np.eye(n, dtype=bool)
    lo, hi = BANDWIDTH_GBPS.lo, BANDWIDTH_GBPS.hi
    bad_val = np.argwhere(off & ~((m >= lo) & (m <= hi)))  # NaN fails too
    if len(bad_val):
        r, c = bad_val[0]
        raise InputError(source, f"bandwidth_matrix_gbps[{r}][{c}]", BANDWIDTH_GBPS.problem(float(m[r, c])) or "")
    asym = np.argwhere(off & ~np.isclose(m, m.T, rtol=1e-9, atol=0))
    if len(asym):
        r, c = asym[0]
        raise InputError(source, f"bandwidth_matrix_gbps[{r}][{c}]",
                         f"matrix must be symmetric: [{r}][{c}]={m[r, c]} but [{c}][{r}]={m[c, r]}")
    return m


def _without_down(cluster: Cluster, down: list[str], index: dict[str, int], source: str) -> Cluster:
    """``cluster`` less the devices the spec's ``down`` names (every device down is refused)."""
    if not down:
        return cluster
    out: set[int] = set()
    for i, ref in enumerate(down):
        out.update(device_refs(cluster.devices, cluster.nodes, ref, index, source, f"down[{i}]"))
    if len(out) == cluster.size:
        raise InputError(source, "down", "every device is down: nothing left to plan for")
    return cluster.subset([d.id for d in cluster.devices if d.id not in out])


def _interfaces(spec: _ClusterSpec, source: str) -> np.ndarray | None:
    """Each device's network interface, numbered over the cluster in device order (``nodes[].nics``: device k of a
    node uses interface k·nics // count); None when no node gives ``nics`` (one interface per node)."""
    if not any(node.nics for node in spec.nodes):
        return None
    out: list[int] = []
    for i, node in enumerate(spec.nodes):
        nics = node.nics or 1
        if nics > node.count:
            raise InputError(source, f"nodes[{i}].nics", f"{nics} network interfaces for {node.count} devices: at "
                             "most one per device")
        for _ in range(node.repeat):
            first = out[-1] + 1 if out else 0
            out.extend(first + k * nics // node.count for k in range(node.count))
    return np.asarray(out, dtype=np.int64)


def device_refs(devices: Sequence[Device], nodes: Sequence[str], ref: str, index: dict[str, int], source: str,
                where: str) -> list[int]:
    """Device ids a spec reference names among ``devices`` (of nodes ``nodes``; ``index``: node name → its
    position, plain names of nodes without ``repeat`` included): a node (``p3-1``, or ``p3``) or one device of it
    (``p3-1:2``: node and index inside it). Raises InputError naming ``where``."""
    node, colon, local = ref.partition(":")
    if node not in index:
        raise InputError(source, where, f"unknown node {node!r} (nodes: {', '.join(nodes[:8])}"
                         + (", ..." if len(nodes) > 8 else "") + ")")
    name = nodes[index[node]]
    ids = [d.id for d in devices if d.node == name]
    if not colon:
        return ids
    k = parse_index(local)
    if k is None or k >= len(ids):
        raise InputError(source, where, f"{ref[:40]!r}: node {name} has devices :0..:{len(ids) - 1}")
    return [ids[k]]


def _with_stragglers(devices: list[Device], stragglers: dict[str, float], index: dict[str, int],
                     node_names: list[str], source: str) -> list[Device]:
    """``devices`` with each straggler's type slowed (:meth:`GpuType.slowed`; factor 1 leaves it healthy)."""
    out = list(devices)
    named: dict[int, str] = {}
    for ref, factor in stragglers.items():
        for d in device_refs(devices, node_names, ref, index, source, f"stragglers.{ref}"):
            if d in named:  # "the last entry wins" would be a silent choice
                raise InputError(source, f"stragglers.{ref}", f"device {d} is named twice (also by {named[d]!r}); "
                                 "give each device one factor")
            named[d] = ref
            if factor != 1:
                out[d] = replace(out[d], gpu=out[d].gpu.slowed(factor))
    return out


_SITE_FIELDS = ("electricity_per_kwh", "carbon_g_per_kwh", "pue")


def _pricing(spec: _ClusterSpec, source: str, group_of: list[int]) -> Pricing | None:
    """Every device's price and site figures (a node group's own, else its GPU type's price and the top-level site
    figures); None when the spec gives none at all."""
    given = any(getattr(spec, f) is not None for f in _SITE_FIELDS) or spec.currency is not None or \
        any(t.price_per_hour is not None for t in spec.gpu_types.values()) or \
        any(getattr(nd, f) is not None for nd in spec.nodes for f in (*_SITE_FIELDS, "price_per_hour"))
    if not given:
        return None
    per_group = []
    for i, node in enumerate(spec.nodes):
        typ = spec.gpu_types.get(node.gpu)
        if node.price_per_hour is not None:
            price, field = node.price_per_hour, f"nodes[{i}].price_per_hour"
        elif typ is not None and typ.price_per_hour is not None:
            price, field = typ.price_per_hour, f"gpu_types.{node.gpu}.price_per_hour"
        else:
            price, field = None, f"nodes[{i}].price_per_hour"
        site = {f: getattr(node, f) if getattr(node, f) is not None else getattr(spec, f) for f in _SITE_FIELDS}
        per_group.append(DevicePrice(price, site["electricity_per_kwh"], site["carbon_g_per_kwh"],
                                     site["pue"] if site["pue"] is not None else 1.0, field, f"nodes[{i}]"))
    return Pricing(spec.currency or "units", tuple(per_group[g] for g in group_of), source)
