"""The schedule of one clock choice as plain bars (for the Gantt chart of ``ampe frontier/search --timeline``).

Every computation starts as early as its dependencies allow (the DAG's earliest schedule, as DeepSpeed runs it),
with its time at the chosen clock; transfers are bars of their own from the sending to the receiving stage. One
longest path (:func:`ampe.tradeoff.evaluate.critical_path`) is flagged ``critical``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ampe.costmodel.catalog import GpuType
from ampe.tradeoff.dag import ComputationDag
from ampe.tradeoff.evaluate import OptionTable, critical_path, earliest


@dataclass(frozen=True)
class Bar:
    """One computation (``kind`` forward/backward, at ``mhz``) or transfer (``kind`` transfer, ``mhz`` None, sent
    from ``stage`` to ``to_stage``), ``start_s`` .. ``start_s + duration_s`` seconds into the iteration."""

    kind: str
    stage: int
    microbatch: int
    start_s: float
    duration_s: float
    mhz: float | None
    critical: bool
    to_stage: int | None = None
    chunk: int = 0


@dataclass(frozen=True)
class ClockTimeline:
    """All bars of one iteration of one pipeline and its length (s)."""

    bars: tuple[Bar, ...]
    num_stages: int
    makespan_s: float
    # Per stage: its GPU type's name and maximum SM clock (MHz); empty when unknown (a bare measured profile).
    stage_types: tuple[tuple[str, float], ...] = ()

    def clock_share(self, bar: Bar) -> float | None:
        """``bar``'s clock as a share of its stage's GPU type's maximum clock (None: transfer or types unknown)."""
        if bar.mhz is None or not self.stage_types:
            return None
        return bar.mhz / self.stage_types[bar.stage][1]

    @property
    def computations(self) -> tuple[Bar, ...]:
        """The forward/backward bars."""
        return tuple(b for b in self.bars if b.mhz is not None)


def timeline(dag: ComputationDag, choice: Sequence[int] | np.ndarray,
             table: OptionTable | None = None, gpus: Sequence[GpuType] | None = None) -> ClockTimeline:
    """Bars of the earliest schedule of ``choice`` (option index per DAG node); ``gpus``: each stage's GPU type
    (per stage, or per virtual stage with stage s's first), so the picture can name them and colour each stage
    against its own type's maximum clock."""
    table = table or OptionTable.of(dag)
    choice = np.asarray(choice, dtype=np.int64)
    times = table.time_s[np.arange(len(dag.nodes)), choice]
    es, _ef = earliest(dag, times[None, :])
    path, makespan = critical_path(dag, [float(t) for t in times])
    on_path = set(path)
    bars = []
    for v, node in enumerate(dag.nodes):
        if dag.is_computation(v):
            mhz: float | None = dag.specs[node.spec].options[int(choice[v])].mhz
            to = None
        else:
            mhz = None
            to = dag.nodes[dag.succs[v][0]].stage if dag.succs[v] else None
        bars.append(Bar(node.kind, node.stage, node.microbatch, float(es[0, v]), float(times[v]), mhz,
                        v in on_path, to, node.chunk))
    types = tuple((g.name, float(g.sm_clock_max_mhz)) for g in gpus[:dag.num_stages]) if gpus else ()
    return ClockTimeline(tuple(bars), dag.num_stages, float(makespan), types)
