"""Baseline clock planners for benchmarks and reports: EnvPipe's envelope heuristic and one global clock (Zeus).

* **EnvPipe** (ATC'23, envpipe.md §2.3, run offline on the DAG): units on the outer envelope of 1F1B (every unit of
  the last stage, the first micro-batch's forwards, the last micro-batch's backwards) run at f_max, all others at
  their stage's minimum-energy clock f_opt (EnvPipe never goes below it). Then, repeatedly, find the critical path
  and raise the units on it that have the lowest clock by ``step_mhz`` (EnvPipe's 30 MHz), until the iteration is
  no slower than all-max · (1 + ε) or nothing on the critical path can be raised.
* **ZeusGlobal**: one SM clock for every GPU (each GPU type uses its highest clock not above it), swept over all
  clocks. (Perseus's ZeusGlobal scans power limits; clocks are ampe's knob.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ampe.costmodel.schedules import BACKWARD, FORWARD
from ampe.tradeoff.dag import ComputationDag
from ampe.tradeoff.evaluate import Evaluation, OptionTable, critical_path, evaluate_choice, fastest_choice


@dataclass(frozen=True)
class BaselinePoint:
    """A baseline schedule: clock choice per DAG node and its evaluation."""

    choice: tuple[int, ...]
    evaluation: Evaluation
    label: str


def envpipe(dag: ComputationDag, epsilon: float = 0.0, step_mhz: float = 30.0) -> BaselinePoint:
    """EnvPipe's plan: envelope at f_max, the rest at f_opt, then raise critical-path clocks until the iteration
    time is ≤ all-max time · (1 + ``epsilon``)."""
    table = OptionTable.of(dag)
    fast = fastest_choice(dag)
    target = evaluate_choice(dag, fast, table).time_s * (1 + epsilon) * (1 + 1e-12)
    last = dag.num_stages - 1
    choice = fast.copy()
    for v, node in enumerate(dag.nodes):
        if not dag.is_computation(v):
            continue
        envelope = (node.stage == last or (node.microbatch == 0 and node.kind == FORWARD)
                    or (node.microbatch == dag.num_microbatches - 1 and node.kind == BACKWARD))
        if not envelope:
            opts = dag.specs[node.spec]
            choice[v] = opts.options.index(opts.min_energy())  # raw-energy valley: EnvPipe's f_opt
    times = [float(table.time_s[v, c]) for v, c in enumerate(choice)]
    while True:
        path, makespan = critical_path(dag, times)
        if makespan <= target:
            break
        raisable = [v for v in path if dag.is_computation(v) and choice[v] != fast[v]]
        if not raisable:
            break
        opts_of = [dag.specs[dag.nodes[v].spec].options for v in raisable]
        clocks = [o[choice[v]].mhz for v, o in zip(raisable, opts_of, strict=False)]
        lowest = min(clocks)
        for v, node_opts, f in zip(raisable, opts_of, clocks, strict=True):
            if f == lowest:
                choice[v] = _raise(node_opts, choice[v], step_mhz, fast[v])
                times[v] = float(table.time_s[v, choice[v]])
    return BaselinePoint(tuple(int(c) for c in choice), evaluate_choice(dag, choice, table), "envpipe")


def _raise(opts: Sequence[Any], current: int, step_mhz: float, fastest: int) -> int:
    """The option with the lowest clock ≥ current + step (the fastest option if none is)."""
    want = opts[current].mhz + step_mhz
    above = [i for i, o in enumerate(opts) if o.mhz >= want - 1e-9 and o.time_s <= opts[current].time_s]
    return min(above, key=lambda i: opts[i].mhz) if above else fastest


def global_clock(dag: ComputationDag) -> list[BaselinePoint]:
    """ZeusGlobal: every computation at one global SM clock, for every clock any stage supports (slowest first)."""
    table = OptionTable.of(dag)
    clocks = sorted({o.mhz for v in range(len(dag.nodes)) if dag.is_computation(v)
                     for o in dag.options(v).options})
    out = []
    for f in clocks:
        choice = np.zeros(len(dag.nodes), dtype=np.int64)
        for v in range(len(dag.nodes)):
            opts = dag.options(v)
            choice[v] = opts.options.index(opts.at_or_below(f)) if dag.is_computation(v) else 0
        out.append(BaselinePoint(tuple(int(c) for c in choice), evaluate_choice(dag, choice, table),
                                 f"global {f:g} MHz"))
    return out
