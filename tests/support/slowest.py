"""The slowest GPU type of a device group, one group at a time: the reference the vectorised layout
(:class:`ampe.costmodel.layout.DeviceTypes`) is checked against."""

from __future__ import annotations

from ampe.costmodel.catalog import GpuType
from ampe.costmodel.estimate import CostModel


def slowest_gpu(cm: CostModel, devices: tuple[int, ...]) -> GpuType:
    """The slowest GPU type among ``devices`` (by the model's total layer time at tp=1, mbs=1; ties: by name)."""
    gpus = [cm.cluster.devices[d].gpu for d in devices]
    return max(gpus, key=lambda g: (cm.slowness(g.name), g.name))
