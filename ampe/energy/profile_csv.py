"""Read a measured Perseus/Zeus instruction profile: ``stage,instruction,frequency,time,energy`` (CSV).

The format of zeus ``examples/pipeline_frequency_optimizer`` (time in s, energy in J, averaged per instruction);
extra columns such as ``rank,dp_rank,pp_rank,tp_rank`` (zeus ``InstructionProfilingResult.to_csv``) are allowed.
With a ``rank`` column, the rows of all ranks of a stage are combined as zeus ``make_3d_parallel`` does: time is
the maximum over ranks, energy the sum, and the stage counts one GPU per rank (its blocking power scales with it);
only clocks measured on every rank of the stage are kept. Bad input raises InputError naming file and field.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

from ampe.costmodel.schedules import BACKWARD, FORWARD
from ampe.errors import InputError
from ampe.io import csv_records, read_text
from ampe.plausible import CLOCK_MHZ
from ampe.tradeoff.dag import ComputationDag
from ampe.tradeoff.options import OpOptions, Option

COLUMNS = ("stage", "instruction", "frequency", "time", "energy")


@dataclass(frozen=True)
class InstructionProfile:
    """Options per (stage, instruction) and GPUs per stage, from one profile file."""

    specs: dict[tuple[int, str], OpOptions]
    gpus_per_stage: tuple[int, ...]
    source: str

    @property
    def num_stages(self) -> int:
        """Number of pipeline stages in the profile."""
        return len(self.gpus_per_stage)

    def floored(self, unit_s: float) -> InstructionProfile:
        """This profile in Perseus's time accounting: every time floored to a multiple of ``unit_s`` (s)."""
        return InstructionProfile({k: v.floored(unit_s) for k, v in self.specs.items()}, self.gpus_per_stage,
                                  self.source)

    def stage_specs(self) -> list[dict[str, OpOptions]]:
        """Per stage: {"forward": options, "backward": options} (the DAG builder's input)."""
        return [{k: self.specs[(s, k)] for k in (FORWARD, BACKWARD)} for s in range(self.num_stages)]


MAX_MHZ = int(CLOCK_MHZ.hi)  # ampe.plausible, as the plan formats: no accelerator clocks above this
MAX_TIME_S = 1e5  # one forward or backward of one micro-batch: a day would already be absurd
MAX_ENERGY_J = 1e9  # one computation: 1 GJ is 100 kW for three hours


def _number(source: str, where: str, text: str) -> float:
    try:
        x = float(text)
    except (TypeError, ValueError):
        raise InputError(source, where, f"not a number: {text!r}") from None
    if not math.isfinite(x):
        raise InputError(source, where, f"not a finite number: {text!r}")
    return x


def load_instruction_profile(path: str | Path, num_stages: int | None = None) -> InstructionProfile:
    """Parse and validate ``path``; ``num_stages`` (if given) must match the stages in the file."""
    source = str(path)
    text = read_text(path)
    rows: dict[tuple[int, str, float, str], tuple[float, float]] = {}
    for rowno, row in csv_records(source, text, COLUMNS):
        where = f"row {rowno}"
        stage_f = _number(source, f"{where}.stage", row["stage"])
        if stage_f < 0 or not stage_f.is_integer():
            raise InputError(source, f"{where}.stage", f"must be a non-negative integer, got {row['stage']!r}")
        instr = row["instruction"]
        if instr not in (FORWARD, BACKWARD):
            raise InputError(source, f"{where}.instruction", f"must be 'forward' or 'backward', got {instr!r}")
        freq = _number(source, f"{where}.frequency", row["frequency"])
        t = _number(source, f"{where}.time", row["time"])
        e = _number(source, f"{where}.energy", row["energy"])
        if freq <= 0 or freq > MAX_MHZ:
            raise InputError(source, f"{where}.frequency", f"must be 1..{MAX_MHZ} MHz, got {freq:g}")
        if t < 0:
            raise InputError(source, f"{where}.time", f"negative time {t}")
        if t == 0:
            raise InputError(source, f"{where}.time", "time must be positive")
        if t > MAX_TIME_S:
            raise InputError(source, f"{where}.time", f"{t:g} s for one computation; at most {MAX_TIME_S:g} s")
        if e < 0:
            raise InputError(source, f"{where}.energy", f"negative energy {e}")
        if e > MAX_ENERGY_J:  # sums of 1e308 J overflow to infinity, which no JSON can hold
            raise InputError(source, f"{where}.energy", f"{e:g} J for one computation; at most {MAX_ENERGY_J:g} J")
        rank = row.get("rank", "")
        key = (int(stage_f), instr, freq, rank)
        if key in rows:
            raise InputError(source, where, f"duplicate row for stage {key[0]} {instr} at {freq:g} MHz")
        rows[key] = (t, e)
    if not rows:
        raise InputError(source, "(rows)", "no measurements (no clocks)")
    stages = sorted({k[0] for k in rows})
    n = num_stages if num_stages is not None else stages[-1] + 1
    extra = [s for s in stages if s >= n]
    if extra:
        raise InputError(source, "stage", f"stage {extra[0]} is out of range for {n} stages")
    specs: dict[tuple[int, str], OpOptions] = {}
    gpus = []
    for s in range(n):
        ranks = {k[3] for k in rows if k[0] == s}
        if not ranks:
            raise InputError(source, "stage", f"stage {s} has no rows (expected stages 0..{n - 1})")
        gpus.append(len(ranks))
        for instr in (FORWARD, BACKWARD):
            by_rank = {r: {k[2]: rows[k] for k in rows if k[0] == s and k[1] == instr and k[3] == r} for r in ranks}
            if not any(by_rank.values()):
                raise InputError(source, "instruction", f"stage {s} has no '{instr}' rows")
            clocks = set.intersection(*(set(c) for c in by_rank.values()))
            if not clocks:
                raise InputError(source, "frequency", f"stage {s} {instr}: no clock measured on every rank")
            opts = tuple(Option(f, max(by_rank[r][f][0] for r in ranks), sum(by_rank[r][f][1] for r in ranks))
                         for f in sorted(clocks))
            specs[(s, instr)] = OpOptions(opts)
    return InstructionProfile(specs, tuple(gpus), source)


def instruction_profile_csv(dag: ComputationDag) -> str:
    """The per-stage instruction profile of a computation DAG in this module's format (``stage,instruction,
    frequency,time,energy``; seconds and joules of one micro-batch, all the stage's GPUs), as Zeus's pipeline
    frequency optimizer and :func:`load_instruction_profile` read it. Interleaved DAGs (several chunks per stage)
    are refused: the format has one forward and one backward per stage."""
    if getattr(dag, "virtual_stages", 1) > 1 or any(n.chunk for n in dag.nodes):
        raise ValueError("an interleaved pipeline has several chunks per stage; the profile format has one")
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    seen: set[tuple[int, str]] = set()
    for node in sorted(dag.nodes, key=lambda n: (n.stage, n.kind != FORWARD)):
        key = (node.stage, node.kind)
        if node.kind not in (FORWARD, BACKWARD) or key in seen:
            continue
        seen.add(key)
        for o in sorted(dag.specs[node.spec].options, key=lambda o: -o.mhz):
            w.writerow([node.stage, node.kind, f"{o.mhz:g}", f"{o.time_s:.9g}", f"{o.energy_j:.9g}"])
    return buf.getvalue()
