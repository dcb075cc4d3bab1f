"""Communication times from the device-pair bandwidth (bytes/s; a :class:`~ampe.costmodel.links.LinkBandwidth` or a
matrix) and a per-message latency (s).

* Point-to-point: ``latency + bytes / bandwidth`` over the real device pair.
* A pipeline boundary at tensor-parallel degree tp (:func:`pipe_transfer_s`): DeepSpeed's pipeline engine sends
  each shard's 1/tp of the activation (``pipe_partitioned``; the gradient likewise, ``grad_partitioned``) over its
  own shard-to-shard link, and the receiving stage all-gathers the pieces over its tensor-parallel ring:
  ``latency + bytes/tp / link + (tp−1)/tp · bytes / ring + (tp−1) · latency``. ``link`` is what each shard's flow
  gets with the other flows of the boundary running at once (shared network interfaces:
  :meth:`~ampe.costmodel.links.LinkBandwidth.concurrent`).
* Ring all-reduce (BytePS / AMP Eq. 3): ``2(n−1)/n · bytes / B_min + 2(n−1) · latency`` where ``B_min`` is the
  slowest link *of the ring in its real order*, wrap-around link included. (AMP's reference code looks at only the
  last link of the ring; ampe takes the minimum over every hop.)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ampe.costmodel.links import Bandwidth


def p2p_time(nbytes: float, bandwidth: float, latency_s: float = 0.0) -> float:
    """Seconds to send ``nbytes`` over a link of ``bandwidth`` bytes/s (0 when nothing is sent)."""
    if nbytes <= 0:
        return 0.0
    return latency_s + nbytes / bandwidth


def pipe_transfer_s(nbytes: np.ndarray | float, tp: int, link: np.ndarray | float, ring: np.ndarray | float,
                    latency_s: float) -> np.ndarray:
    """Seconds one activation (or its gradient) of ``nbytes`` bytes per tensor-parallel rank takes across a pipeline
    boundary (module docstring): each of the tp shards sends ``nbytes/tp`` over a flow of ``link`` bytes/s, then the
    receiver all-gathers them over its ring of slowest hop ``ring`` bytes/s. Arrays broadcast; 0 where nothing is
    sent or the link is a device to itself (inf)."""
    nbytes, link, ring = (np.asarray(x, dtype=float) for x in (nbytes, link, ring))
    with np.errstate(divide="ignore", invalid="ignore"):
        send = latency_s + nbytes / tp / link
        gather = (tp - 1) / tp * nbytes / ring + (tp - 1) * latency_s if tp > 1 else 0.0
    return np.where((nbytes > 0) & np.isfinite(link), send + gather, 0.0)


def ring_bandwidth(bandwidth: Bandwidth, ring: Sequence[int]) -> float:
    """Slowest hop (bytes/s) of the ring ``ring[0] → ring[1] → … → ring[-1] → ring[0]``; inf for one member."""
    n = len(ring)
    if n < 2:
        return float("inf")
    idx = np.asarray(ring)
    return float(np.min(bandwidth[idx, np.roll(idx, -1)]))


def ring_allreduce_time(nbytes: float, n: int, slowest_bandwidth: float, latency_s: float = 0.0) -> float:
    """Seconds for a ring all-reduce of ``nbytes`` over ``n`` members whose slowest hop is ``slowest_bandwidth``."""
    if n < 2 or nbytes <= 0:
        return 0.0
    return 2.0 * (n - 1) / n * nbytes / slowest_bandwidth + 2.0 * (n - 1) * latency_s

