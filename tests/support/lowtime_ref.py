"""Reference frontier from the public ``lowtime`` 0.3.0 package, the way zeus's ``run_optimization.py`` drives it.

Dev-only (``lowtime`` is in the ``dev`` extra); used as an oracle by tests and ``benchmarks/frontier.py``.
Reconstructed flow (perseus.md §5.4): per (stage, instruction) the profiled options become ``ExecutionOption``s
with cost = energy − p2p_power · quant_time · unit_time; ``CandidateExecutionOptions`` keeps the Pareto ones
(noise factor 1.0, or 0.95 when 3 or fewer survive); an ``ExponentialModel`` (grid search, strategy "best") is
fitted; ``Synchronous1F1B`` per stage gives the instructions; edges join consecutive instructions of a stage plus
``forward_dep``/``backward_dep``; a dummy source/sink close the DAG; ``PhillipsDessouky(dag).run()`` yields one
point per step. Each point's plan is read from the instructions' ``assigned_knob``.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

import numpy as np

from ampe.costmodel.schedules import FORWARD
from ampe.tradeoff.dag import ComputationDag


@dataclass(frozen=True)
class LowtimeResult:
    """lowtime's frontier: per step the clock choice (option index per ampe DAG node) and its planned time;
    ``reported``: per step (time s, energy J) as Perseus publishes them (quantized time; fitted cost plus blocking
    power of every stage over that time)."""

    choices: tuple[np.ndarray, ...]
    planned_units: tuple[int, ...]
    reported: tuple[tuple[float, float], ...] = ()


def run_lowtime(dag: ComputationDag, unit_s: float, blocking_w_per_stage: list[float] | None = None) -> LowtimeResult:
    """Run lowtime on the same options as ``dag`` (1F1B, no transfer nodes); returns its plans in ampe's terms."""
    import networkx as nx
    from lowtime.cost_model import ExponentialModel
    from lowtime.operation import CandidateExecutionOptions, ExecutionOption, OperationSpec
    from lowtime.perseus.instruction import Backward, Forward
    from lowtime.perseus.schedule import Synchronous1F1B
    from lowtime.solver import PhillipsDessouky

    if dag.schedule != "1f1b" or any(not dag.is_computation(v) for v in range(len(dag.nodes))):
        raise ValueError("the lowtime reference supports 1F1B DAGs without transfer nodes")
    blocking = blocking_w_per_stage or list(dag.blocking_w)
    logging.getLogger("lowtime").setLevel(logging.WARNING)
    spec_of: dict[tuple[int, str], OperationSpec] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # curve_fit overflow/covariance warnings of the grid search
        with np.errstate(all="ignore"):
            for node in dag.nodes:
                key = (node.stage, node.kind)
                if key in spec_of:
                    continue
                opts = []
                for o in dag.specs[node.spec].options:
                    quant = int(o.time_s // unit_s)
                    opts.append(ExecutionOption(real_time=o.time_s, unit_time=unit_s,
                                                cost=o.energy_j - blocking[node.stage] * quant * unit_s, knob=o.mhz))
                cand = CandidateExecutionOptions(options=list(opts), noise_factor=1.0)
                if len(cand.options) <= 3:
                    cand = CandidateExecutionOptions(options=list(opts), noise_factor=0.95)
                spec_of[key] = OperationSpec(options=cand,
                                             cost_model=ExponentialModel(cand, search_strategy="best"))
            n, m = dag.num_stages, dag.num_microbatches
            g = nx.DiGraph()
            g.add_node(0, op=_dummy())
            g.add_node(1, op=_dummy())
            inst_id: dict[tuple[str, int, int], int] = {}
            insts = {}
            for s in range(n):
                prev = None
                for inst in Synchronous1F1B(n, m, s, {Forward: spec_of[(s, "forward")],
                                                      Backward: spec_of[(s, "backward")]}):
                    i = g.number_of_nodes()
                    g.add_node(i, op=inst)
                    kind = FORWARD if isinstance(inst, Forward) else "backward"
                    inst_id[(kind, s, inst.micro_batch_id)] = i
                    insts[i] = inst
                    if prev is not None:
                        g.add_edge(prev, i)
                    prev = i
            for mb in range(m):
                for s in range(n - 1):
                    g.add_edge(inst_id[(FORWARD, s, mb)], inst_id[(FORWARD, s + 1, mb)])
                    g.add_edge(inst_id[("backward", s + 1, mb)], inst_id[("backward", s, mb)])
            for v in list(g.nodes):
                if v > 1 and g.in_degree(v) == 0:
                    g.add_edge(0, v)
                if v > 1 and g.out_degree(v) == 0:
                    g.add_edge(v, 1)
            g.graph["source_node"], g.graph["sink_node"] = 0, 1
            ampe_node = {inst_id[(node.kind, node.stage, node.microbatch)]: v for v, node in enumerate(dag.nodes)}
            knob_index = [{o.mhz: k for k, o in enumerate(dag.specs[node.spec].options)} for node in dag.nodes]

            def snapshot(knob_of) -> np.ndarray:
                choice = np.zeros(len(dag.nodes), dtype=np.int64)
                for i, v in ampe_node.items():
                    choice[v] = knob_index[v][knob_of(insts[i])]
                return choice

            start = snapshot(lambda inst: inst.spec.options.get_knob_for(inst.max_duration))
            choices = [start]
            units = []
            reported = []
            solver = PhillipsDessouky(g)
            for result in solver.run():
                choices.append(snapshot(lambda inst: inst.assigned_knob))
                units.append(result.quant_time)
                t = result.quant_time * unit_s
                reported.append((t, result.cost + sum(blocking) * t))
    if len(units) < 2:
        # lowtime ends its PD loop when a step costs less than 1e-6 (a free speed-up, or a flat exponential fit):
        # on some profiles that is the first step, and an oracle run that traced nothing must not pass as a match.
        raise LowtimeStoppedError(f"lowtime stopped after {len(units)} PD step(s): nothing to compare with")
    return LowtimeResult(tuple(choices), tuple(units), tuple(reported))


class LowtimeStoppedError(RuntimeError):
    """lowtime's solver ended before tracing a frontier (its stop rule, not a failure of ampe)."""


def _dummy():
    from lowtime.operation import DummyOperation

    return DummyOperation()
