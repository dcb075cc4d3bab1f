"""ClockPlan: the SM clock of every forward/backward of one iteration, per pipeline stage, in execution order.

JSON form (also one point of ``ampe frontier --out``)::

    {"time_s": 1.23, "energy_j": 4567.8, "effective_energy_j": 4000.1,
     "plan": [[["forward", 0, 1410], ["forward", 1, 1230], ...],   # stage 0
              ...]}

Plans are data: read with ``json.loads`` and validated here, never evaluated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

import numpy as np

from ampe.errors import InputError
from ampe.tradeoff.dag import ComputationDag
from ampe.tradeoff.evaluate import Evaluation

PlanEntry = tuple[str, int, float]  # (instruction, micro-batch, SM clock in MHz)


@dataclass(frozen=True)
class ClockPlan:
    """Per stage: (instruction, micro-batch, MHz) for one iteration in execution order; predicted time (s) and
    energy (J, blocking until ``time_s`` included) of the chosen point; Eq. 4 effective energy (J)."""

    stages: tuple[tuple[PlanEntry, ...], ...]
    time_s: float
    energy_j: float
    effective_energy_j: float | None = None

    def for_stage(self, stage: int) -> tuple[PlanEntry, ...]:
        """The plan of one pipeline stage (every GPU of that stage runs it)."""
        return self.stages[stage]

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict."""
        out: dict[str, Any] = {"time_s": self.time_s, "energy_j": self.energy_j}
        if self.effective_energy_j is not None:
            out["effective_energy_j"] = self.effective_energy_j
        out["plan"] = [[[i, mb, _mhz(f)] for i, mb, f in stage] for stage in self.stages]
        return out

    @classmethod
    def from_json(cls, data: Any, source: str = "plan") -> ClockPlan:
        """Parse and validate the JSON form; bad input raises InputError naming the field."""
        from ampe.formats.frequency_plan import parse_stage_steps  # pydantic: only readers pay for it

        if not isinstance(data, dict):
            raise InputError(source, "(root)", "a frequency plan must be a JSON object")
        values = {key: data.get(key) for key in ("time_s", "energy_j")}
        for key, v in values.items():
            if not _number(v) or v < 0:
                raise InputError(source, key, "must be a non-negative number")
        time_s, energy_j = values["time_s"], values["energy_j"]
        assert _number(time_s) and _number(energy_j)
        parsed = tuple(tuple((i, mb, float(mhz)) for i, mb, mhz in stage)
                       for stage in parse_stage_steps(data.get("plan"), source, "plan"))
        eff = data.get("effective_energy_j")
        return cls(parsed, float(time_s), float(energy_j),
                   float(eff) if _number(eff) else None)


def _number(x: Any) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf")


def _mhz(f: float) -> int | float:
    return int(f) if float(f).is_integer() else round(float(f), 3)


def plan_of(dag: ComputationDag, choice: Sequence[int] | np.ndarray, evaluation: Evaluation) -> ClockPlan:
    """The plan of a clock ``choice`` (option index per DAG node) and its evaluation."""
    stages = []
    for order in dag.stage_order:
        entries = []
        for v in order:
            node = dag.nodes[v]
            entries.append((node.kind, node.microbatch, dag.specs[node.spec].options[int(choice[v])].mhz))
        stages.append(tuple(entries))
    return ClockPlan(tuple(stages), evaluation.time_s, evaluation.energy_j, evaluation.effective_j)
