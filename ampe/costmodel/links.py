"""The device×device bandwidth of a cluster, stored by link class instead of as a dense matrix.

A spec gives bandwidth per node (``intra_gbps`` between two devices of the node, ``inter_gbps`` out of it), a few
node-pair overrides (``links``), or, rarely, a full device-level matrix (``bandwidth_matrix_gbps``). So the bandwidth
between devices ``a`` and ``b`` (bytes/s) is, in this order:

1. ``inf`` when ``a == b``;
2. the override of their node pair, if the spec has one (a pair of one node overrides its ``intra``);
3. their node's ``intra`` when they share a node;
4. ``min(inter[node a], inter[node b])`` otherwise.

:class:`LinkBandwidth` keeps O(devices + nodes + overrides) numbers (a 16,384-device cluster: a few hundred KB, where
the dense float64 matrix was 2 GiB) and answers pair queries with the values the matrix had: ``bw[a, b]`` (or
:meth:`LinkBandwidth.pairs`) with integer indices or integer arrays, broadcast pairwise, which is what the cost model,
the search and the calibration ask; :meth:`~LinkBandwidth.subset` and :meth:`~LinkBandwidth.scaled` derive others.
It is not an array: any other index (a slice, a mask) is a TypeError, and the whole matrix is asked for by name,
:meth:`~LinkBandwidth.dense`, which refuses clusters of more than :data:`DENSE_MAX_DEVICES` devices.
A spec's ``bandwidth_matrix_gbps`` is kept as given (``matrix``: such a spec is itself n² numbers, so it is small).

**Shared network interfaces.** Each device sends and receives its inter-node traffic through one network interface
(NIC) of its node (``nic_of``: one per node unless the spec gives ``nics``). The bandwidth above is what one flow
gets alone; flows that run at the same time and leave (or enter) a node through one NIC share it:
:meth:`LinkBandwidth.concurrent` gives each of a set of simultaneous flows ``bw[a, b] / max(flows out of a's NIC,
flows into b's NIC)`` (full duplex: a NIC's two directions are counted apart). Flows inside a node are not shared
(NVLink/PCIe between two devices).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

DENSE_MAX_DEVICES = 4096  # LinkBandwidth.dense() beyond this refuses: the matrix would be over 128 MiB


@dataclass(frozen=True, eq=False)
class LinkBandwidth:
    """Bandwidth (bytes/s) between any two devices, by link class (module docstring); read-only."""

    node_of: np.ndarray  # (n,) node index of each device (int64)
    intra: np.ndarray  # (nodes,) bytes/s between two devices of one node
    inter: np.ndarray  # (nodes,) bytes/s out of each node; two nodes talk at the smaller of their two
    override_keys: np.ndarray  # (k,) sorted node pairs a·nodes + b (both orders) with their own bandwidth
    override_values: np.ndarray  # (k,) bytes/s of each override
    matrix: np.ndarray | None = None  # (n, n) a spec's full matrix, when it gives one (diagonal inf)
    nic_of: np.ndarray | None = None  # (n,) the network interface each device's inter-node traffic uses (int64,
    # numbered over the cluster); None: one per node (``node_of``)

    def __post_init__(self) -> None:
        for arr in (self.node_of, self.intra, self.inter, self.override_keys, self.override_values, self.matrix,
                    self.nic_of):
            if arr is not None:
                arr.setflags(write=False)

    @classmethod
    def of_nodes(cls, node_of: np.ndarray, intra: np.ndarray, inter: np.ndarray,
                 overrides: dict[tuple[int, int], float] | None = None,
                 nic_of: np.ndarray | None = None) -> LinkBandwidth:
        """From per-node bandwidths and node-pair overrides (node indices → bytes/s; symmetric); ``nic_of``: each
        device's network interface (default: one per node)."""
        nn = len(intra)
        pairs: dict[int, float] = {}
        for (a, b), v in (overrides or {}).items():
            pairs[a * nn + b] = pairs[b * nn + a] = v
        keys = np.array(sorted(pairs), dtype=np.int64)
        values = np.array([pairs[k] for k in keys.tolist()], dtype=float)
        return cls(np.asarray(node_of, dtype=np.int64), np.asarray(intra, dtype=float),
                   np.asarray(inter, dtype=float), keys, values, None, _nics(nic_of))

    @classmethod
    def of_matrix(cls, matrix: np.ndarray, node_of: np.ndarray, nic_of: np.ndarray | None = None) -> LinkBandwidth:
        """From a full device-level matrix (bytes/s; its diagonal is set to inf); ``node_of`` for :meth:`scaled`
        and the shared interfaces, ``nic_of`` as :meth:`of_nodes`."""
        m = np.array(matrix, dtype=float)
        np.fill_diagonal(m, np.inf)
        nn = int(node_of.max()) + 1 if len(node_of) else 0
        return cls(np.asarray(node_of, dtype=np.int64), np.full(nn, np.inf), np.full(nn, np.inf),
                   np.zeros(0, dtype=np.int64), np.zeros(0), m, _nics(nic_of))

    # -- the queries ------------------------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Number of devices."""
        return len(self.node_of)

    def pairs(self, a: Any, b: Any) -> np.ndarray:
        """Bandwidth between devices ``a`` and ``b`` (integers or integer arrays, broadcast together), bytes/s."""
        a = np.asarray(a, dtype=np.int64)
        b = np.asarray(b, dtype=np.int64)
        n = self.size
        a = np.where(a < 0, a + n, a)
        b = np.where(b < 0, b + n, b)
        if self.matrix is not None:
            return self.matrix[a, b]
        na, nb = self.node_of[a], self.node_of[b]
        out = np.where(na == nb, self.intra[na], np.minimum(self.inter[na], self.inter[nb]))
        if len(self.override_keys):
            key = na * len(self.intra) + nb
            pos = np.minimum(np.searchsorted(self.override_keys, key), len(self.override_keys) - 1)
            out = np.where(self.override_keys[pos] == key, self.override_values[pos], out)
        return np.where(a == b, np.inf, out)

    def nics(self) -> np.ndarray:
        """(n,) the network interface of each device (its node's when the node has one)."""
        return self.node_of if self.nic_of is None else self.nic_of

    def concurrent(self, a: Any, b: Any, group: Any = 0) -> np.ndarray:
        """Bandwidth (bytes/s) each flow ``a[i] → b[i]`` gets while every flow of its ``group`` runs at once
        (integer arrays broadcast together): its link's, divided, for a flow between two nodes, by the larger of
        the number of such flows of the group leaving through the sender's NIC and entering through the receiver's
        (module docstring). O(flows · log flows)."""
        a, b, group = np.broadcast_arrays(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64),
                                          np.asarray(group, dtype=np.int64))
        out = np.array(self.pairs(a, b), dtype=float)
        nic = self.nics()
        cross = self.node_of[a] != self.node_of[b]
        if not cross.any():
            return out
        width = int(nic.max()) + 1
        g = group[cross]
        share = np.maximum(_counts(g * width + nic[a[cross]]), _counts(g * width + nic[b[cross]]))
        out[cross] = out[cross] / share
        return out

    def __getitem__(self, key: Any) -> Any:
        """``bw[a, b]``: :meth:`pairs` (a number for two integers); any other index is a TypeError."""
        if isinstance(key, tuple) and len(key) == 2 and all(_integer_index(k) for k in key):
            out = self.pairs(key[0], key[1])
            return out[()] if out.ndim == 0 else out
        raise TypeError("LinkBandwidth takes [a, b] with integer indices or integer arrays; the whole matrix is "
                        "dense()")

    def dense(self, max_devices: int = DENSE_MAX_DEVICES) -> np.ndarray:
        """The (devices, devices) matrix (bytes/s; diagonal inf), for tests, small clusters and reports. Raises
        ValueError beyond ``max_devices`` devices (its memory grows as devices²: 2 GiB at 16,384)."""
        if self.size > max_devices:
            raise ValueError(f"a dense bandwidth matrix of {self.size} devices (over {max_devices}) is refused: "
                             "ask pairs(a, b) instead")
        idx = np.arange(self.size)
        return self.pairs(idx[:, None], idx[None, :])

    # -- derived bandwidths -----------------------------------------------------------------------------------

    def subset(self, ids: Any) -> LinkBandwidth:
        """The bandwidth among devices ``ids`` only, renumbered 0..len(ids)−1 in the order given."""
        idx = np.asarray(ids, dtype=np.int64)
        matrix = None if self.matrix is None else self.matrix[np.ix_(idx, idx)]
        nic = None if self.nic_of is None else self.nic_of[idx]
        return LinkBandwidth(self.node_of[idx], self.intra, self.inter, self.override_keys, self.override_values,
                             matrix, nic)

    def scaled(self, intra: float, inter: float) -> LinkBandwidth:
        """Every link between two devices of one node × ``intra``, every other × ``inter`` (a calibration's link
        efficiencies). Exactly the products of the matrix's entries: a minimum commutes with a positive factor."""
        nn = len(self.intra)
        same_node = (self.override_keys // max(nn, 1)) == (self.override_keys % max(nn, 1))
        values = self.override_values * np.where(same_node, intra, inter)
        matrix = None
        if self.matrix is not None:
            nod = self.node_of
            matrix = self.matrix * np.where(nod[:, None] == nod[None, :], intra, inter)
        return LinkBandwidth(self.node_of, self.intra * intra, self.inter * inter, self.override_keys, values, matrix,
                             self.nic_of)


Bandwidth = LinkBandwidth | np.ndarray  # what the comm formulas index: a cluster's links, or a plain matrix (tests)


def _nics(nic_of: np.ndarray | None) -> np.ndarray | None:
    """``nic_of`` as int64, or None."""
    return None if nic_of is None else np.asarray(nic_of, dtype=np.int64)


def _counts(keys: np.ndarray) -> np.ndarray:
    """For each entry of ``keys``, how many entries equal it."""
    _, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    return counts[inverse.reshape(keys.shape)]


def _integer_index(k: Any) -> bool:
    """An integer or an array of integers (what :meth:`LinkBandwidth.pairs` takes)."""
    if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
        return True
    if isinstance(k, (list, tuple)):
        k = np.asarray(k)
    return isinstance(k, np.ndarray) and k.dtype.kind in "iu"
