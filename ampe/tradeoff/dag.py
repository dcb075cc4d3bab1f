"""The computation DAG of one training iteration (activity on node): the type the trade-off solvers work on.

Nodes are computations (each with its :class:`~ampe.tradeoff.options.OpOptions`) and constant-time transfers, in
topological order (``preds[v] < v``), labelled with the stage, micro-batch and chunk they belong to, and grouped per
stage in execution order. :mod:`ampe.energy.pipeline_dag` builds one from a pipeline schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ampe.tradeoff.levels import Levels
from ampe.tradeoff.options import OpOptions

TRANSFER = "transfer"


@dataclass(frozen=True)
class Node:
    """One DAG node: a computation (``kind`` forward/backward) or a transfer sent by ``stage``."""

    kind: str
    stage: int
    microbatch: int
    chunk: int = 0
    spec: int = 0  # index into ComputationDag.specs


@dataclass(frozen=True)
class ComputationDag:
    """One iteration of one pipeline: nodes in topological order, their predecessors and option sets."""

    nodes: tuple[Node, ...]
    preds: tuple[tuple[int, ...], ...]
    specs: tuple[OpOptions, ...]
    blocking_w: tuple[float, ...]  # per stage: watts while that stage waits (all its GPUs)
    stage_order: tuple[tuple[int, ...], ...]  # per stage: node ids in execution order
    num_microbatches: int
    schedule: str

    @property
    def num_stages(self) -> int:
        """Number of pipeline stages (devices)."""
        return len(self.stage_order)

    @cached_property
    def succs(self) -> tuple[tuple[int, ...], ...]:
        """Successor lists (the reverse of ``preds``)."""
        out: list[list[int]] = [[] for _ in self.nodes]
        for v, ps in enumerate(self.preds):
            for p in ps:
                out[p].append(v)
        return tuple(tuple(s) for s in out)

    @cached_property
    def levels(self) -> Levels:
        """Topological levels with padded predecessor/successor arrays (vectorised longest-path passes)."""
        return Levels.of(self.preds, self.succs)

    @cached_property
    def computation_mask(self) -> np.ndarray:
        """Per node: True for forward/backward computations, False for transfers."""
        return np.asarray([n.kind != TRANSFER for n in self.nodes], dtype=bool)

    @cached_property
    def node_stage(self) -> np.ndarray:
        """Per node: its (device) stage; a transfer's is its sender's."""
        return np.asarray([n.stage for n in self.nodes], dtype=np.int64)

    @cached_property
    def spec_of(self) -> np.ndarray:
        """Per node: the index of its option set in ``specs``."""
        return np.asarray([n.spec for n in self.nodes], dtype=np.int64)

    @cached_property
    def fastest_option(self) -> np.ndarray:
        """Per spec: the index of its fastest option (ties: the cheaper one)."""
        found: dict[int, int] = {}  # id of an option set → its fastest (stages of one type and time share one)
        out = []
        for s in self.specs:
            best = found.get(id(s))
            if best is None:
                opts = s.options
                best = found[id(s)] = min(range(len(opts)), key=lambda i: (opts[i].time_s, opts[i].energy_j))
            out.append(best)
        return np.asarray(out, dtype=np.int64)

    def options(self, v: int) -> OpOptions:
        """The option set of node ``v``."""
        return self.specs[self.nodes[v].spec]

    def is_computation(self, v: int) -> bool:
        """True for forward/backward nodes, False for transfers."""
        return self.nodes[v].kind != TRANSFER
