"""DeepSpeed hostfile and ``--include`` string for a strategy's placement across the cluster's nodes.

The DeepSpeed launcher numbers ranks host by host in hostfile order, so a placement (device id per global rank) can
be launched only when the ranks of each node are contiguous; the node order is then the order of first appearance.
Which GPU of its host a rank drives is the worker's business: the job file carries ``device_local_index`` (the
device's index within its node, per device id) and the worker selects that GPU itself, so any order inside a node
works. (DeepSpeed sets CUDA_VISIBLE_DEVICES to the host's ``--include``d slots, which renumbers them from 0 when a host
is only partly used; the worker maps the physical index through it, :func:`ampe.runtime.placement.visible_gpu_index`.)

Megatron-order placements (the identity) always qualify; :func:`host_layout` raises :class:`UnrealizablePlacementError`
for the others, which the runner records as a skipped trial. (AMP patched DeepSpeed's launcher with a rank map for
this; ampe does not fork DeepSpeed.)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ampe.costmodel.cluster import Cluster
from ampe.errors import InputError
from ampe.io import read_yaml

# a plain host name (RFC 1123's lengths: at most 253 characters, labels of at most 63) or an IPv4 address
_HOSTNAME = re.compile(r"^(?!.{254})[A-Za-z0-9_-]{1,63}(?:\.[A-Za-z0-9_-]{1,63})*\.?$")


class UnrealizablePlacementError(ValueError):
    """The placement cannot be expressed with a hostfile and ``--include`` (see the module docstring)."""


@dataclass(frozen=True)
class HostLayout:
    """Hosts in launch order, each with its slot count and the local GPU indices its ranks use."""

    hosts: tuple[tuple[str, int, tuple[int, ...]], ...]  # (hostname, slots on the host, used local indices, sorted)

    def hostfile_text(self) -> str:
        """MPI-style hostfile, ``<host> slots=<n>`` per line, in launch order."""
        return "".join(f"{h} slots={n}\n" for h, n, _ in self.hosts)

    def include(self) -> str:
        """DeepSpeed ``--include`` value, e.g. ``node-a:0,1@node-b:0,1``."""
        return "@".join(f"{h}:{','.join(map(str, used))}" for h, _, used in self.hosts)

    @property
    def world_size(self) -> int:
        """Number of ranks launched."""
        return sum(len(used) for _, _, used in self.hosts)


def host_layout(cluster: Cluster, placement: Sequence[int], host_map: Mapping[str, str] | None = None) -> HostLayout:
    """The hostfile layout that puts global rank r on device ``placement[r]``.

    ``host_map`` maps cluster node names to the hostnames the launcher should ssh to (default: the node names)."""
    host_map = host_map or {}
    per_node: dict[str, list[int]] = {}
    order: list[str] = []
    prev = None
    for rank, dev_id in enumerate(placement):
        dev = cluster.devices[dev_id]
        if dev.node != prev:
            if dev.node in per_node:
                raise UnrealizablePlacementError(
                    f"ranks of node {dev.node!r} are not contiguous (rank {rank} returns to it); the DeepSpeed "
                    "launcher numbers ranks host by host")
            per_node[dev.node] = []
            order.append(dev.node)
            prev = dev.node
        per_node[dev.node].append(dev.local_index)
    slots = {n: len(ids) for n, ids in cluster.node_devices().items()}
    hosts = []
    for node in order:
        name = host_map.get(node, node)
        if not _HOSTNAME.match(name):
            raise UnrealizablePlacementError(f"hostname {name!r} (node {node!r}) is not a plain host name")
        hosts.append((name, slots[node], tuple(sorted(per_node[node]))))
    return HostLayout(tuple(hosts))


def nodes_used(cluster: Cluster, placement: Sequence[int]) -> list[str]:
    """Distinct node names the placement touches, in rank order."""
    seen: list[str] = []
    for d in placement:
        node = cluster.devices[d].node
        if node not in seen:
            seen.append(node)
    return seen


def load_host_map(path: str | None) -> dict[str, str]:
    """Cluster node name → hostname from a YAML mapping (``--host-map``); empty without a path. Raises InputError."""
    if not path:
        return {}
    raw = read_yaml(path)
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise InputError(path, "(root)", "must map cluster node names to hostnames (strings)")
    return raw
