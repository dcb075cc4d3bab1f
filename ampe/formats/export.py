"""``ampe.export/1``: one strategy of a plan, exported for the user's own training script (``ampe export``).

``ampe export`` writes it (``DIR/export.json``) and :mod:`ampe.runtime.user` reads it inside every rank: the
strategy, the pipeline ``parts`` list, which host and device every global rank runs on, the master address, the
DeepSpeed config and the frequency plan. Reference: docs/export.md.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from ampe.formats._base import FileModel, NonNegativeInt, PositiveInt, Text
from ampe.formats.frequency_plan import FrequencyPlan
from ampe.formats.plan import Predicted

EXPORT_SCHEMA = "ampe.export/1"


class RankEntry(FileModel):
    """Where one global rank runs: its pipeline coordinates and its device (node, host, index within the host)."""

    rank: NonNegativeInt
    stage: NonNegativeInt
    replica: NonNegativeInt
    shard: NonNegativeInt
    device: NonNegativeInt  # device id in the cluster spec
    node: Text  # node name in the cluster spec
    host: Text  # hostname the launcher reaches the node by (host map applied)
    local_index: NonNegativeInt  # the device's index within its host (physical GPU index; CPU: core)
    gpu: Text  # GPU type name (catalog)


class HostEntry(FileModel):
    """One host in launch order: DeepSpeed hostfile slots and the local device indices its ranks use."""

    host: Text
    slots: PositiveInt
    used: list[NonNegativeInt] = Field(min_length=1, fail_fast=True)


class ExportFile(FileModel):
    """One exported strategy: what the user's script needs to build and run it, and how it is launched."""

    schema_: Literal["ampe.export/1"] = Field(default="ampe.export/1", alias="schema")
    plan: Text  # the plan file the strategy came from (absolute path)
    plan_rank: PositiveInt
    model: Text  # zoo name or model YAML path the plan was made for
    seq_len: PositiveInt | None = None  # a Hugging Face config's sequence length (the plan's --seq-len)
    cluster: Text
    cluster_spec: Text | None = None
    device: Literal["cpu", "cuda"]
    dtype: Literal["fp32", "fp16", "bf16"]
    strategy: dict[str, Any]  # pp, dp, tp, mbs, gbs, gas, partition, placement, schedule
    parts: list[NonNegativeInt] = Field(min_length=2, fail_fast=True)  # stage j owns layers parts[j] .. parts[j+1]-1
    ranks: list[RankEntry] = Field(min_length=1, fail_fast=True)
    hosts: list[HostEntry] = Field(min_length=1, fail_fast=True)
    launcher: Literal["torchrun", "deepspeed"]
    master_addr: Text
    master_port: PositiveInt
    freq_backend: Literal["nvml", "emulate", "none"] = "none"  # the backend the export suggests
    frequency_plan: FrequencyPlan | None = None
    deepspeed: dict[str, Any]
    predicted: Predicted | None = None
    measurements: Text | None = None  # default path of the measurements JSONL the recorder appends to

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, populate_by_name=True)

    @model_validator(mode="after")
    def _consistent(self) -> ExportFile:
        pp, dp, tp = (self.strategy.get(k) for k in ("pp", "dp", "tp"))
        if not all(isinstance(v, int) and v >= 1 for v in (pp, dp, tp)):
            raise ValueError("strategy: needs positive integers pp, dp and tp")
        assert isinstance(pp, int) and isinstance(dp, int) and isinstance(tp, int)
        if len(self.parts) != pp + 1:
            raise ValueError(f"parts: needs {pp + 1} boundaries for {pp} stages, got {len(self.parts)}")
        if any(b <= a for a, b in zip(self.parts, self.parts[1:], strict=False)) or self.parts[0] != 0:
            raise ValueError(f"parts: must start at 0 and increase, got {self.parts}")
        if [r.rank for r in self.ranks] != list(range(pp * dp * tp)):
            raise ValueError(f"ranks: needs ranks 0..{pp * dp * tp - 1} in order")
        if self.frequency_plan is not None:
            # each replica's micro-batches under uneven shares, else the one gas
            gas = self.strategy.get("replica_gas") or self.strategy.get("gas")
            v = self.strategy.get("virtual_stages", 1)
            ok = (isinstance(gas, int) and gas >= 1) or (isinstance(gas, list) and len(gas) == dp
                                                         and all(isinstance(g, int) and g >= 1 for g in gas))
            why = self.frequency_plan.check_shape(pp, dp, gas if ok else None,
                                                  v if isinstance(v, int) and v >= 1 else 1)
            if why:
                raise ValueError(f"frequency_plan.{why}")
        return self

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (``schema`` first, every field)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
