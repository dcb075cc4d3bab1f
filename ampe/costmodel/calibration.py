"""Apply a structural calibration to a cluster: the terms a calibrated per-layer table cannot hold.

``ampe report --calibrate OUT.csv`` fits (:mod:`ampe.report.calibrate`):

* a compute factor per GPU type and a micro-batch exponent ``η`` — written into ``OUT.csv``'s per-layer times
  (``time × factor × mbs^(-η)``), so any reader of the CSV gets them;
* a fixed cost per pipeline instruction per GPU type (seconds; ``GpuType.pipeline_op_s``) and an efficiency per link
  class (``intra``/``inter`` node: the achieved fraction of the spec's bandwidth, for pipeline sends and gradient
  all-reduces) — written to the sidecar ``OUT.csv.calibration.json`` that :func:`~ampe.costmodel.profile.load_profile`
  finds and :class:`~ampe.costmodel.estimate.CostModel` applies with :func:`calibrated_cluster`.
"""

from __future__ import annotations

import dataclasses

from ampe.costmodel.cluster import Cluster, Device
from ampe.formats.calibration import CalibrationParams


def link_classes(cluster: Cluster) -> tuple[str, ...]:
    """The link classes present: ``intra`` when a node holds two devices, ``inter`` when there are two nodes."""
    per_node = cluster.node_devices()
    out = []
    if any(len(ids) > 1 for ids in per_node.values()):
        out.append("intra")
    if sum(1 for ids in per_node.values() if ids) > 1:
        out.append("inter")
    return tuple(out)


def calibrated_cluster(cluster: Cluster, params: CalibrationParams) -> Cluster:
    """``cluster`` with ``params``' per-type instruction cost (seconds) and link efficiencies applied."""
    devices = cluster.devices
    if params.pipeline_op_s:
        gpus = {g.name: dataclasses.replace(g, pipeline_op_s=params.pipeline_op_s[g.name])
                for g in cluster.gpu_types() if g.name in params.pipeline_op_s}
        devices = tuple(Device(d.id, d.node, d.local_index, gpus.get(d.gpu.name, d.gpu)) for d in devices)
    bandwidth = cluster.bandwidth
    intra = params.link_efficiency.get("intra", 1.0)
    inter = params.link_efficiency.get("inter", 1.0)
    if intra != 1.0 or inter != 1.0:
        bandwidth = cluster.bandwidth.scaled(intra, inter)
    if devices is cluster.devices and bandwidth is cluster.bandwidth:
        return cluster
    return dataclasses.replace(cluster, devices=devices, bandwidth=bandwidth)
