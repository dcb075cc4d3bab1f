"""Read an ``ampe.plan/1`` file (written by ``ampe search``) into what the trial runner needs.

Only the fields the runner uses are validated, strictly, and every failure is an :class:`InputError` naming the file
and the field (``strategies[2].predicted.iteration_s``); other keys are kept but ignored, so the search may add more.
The runner takes the cluster spec, model and profile from the plan's ``inputs`` (as ``ampe search`` records them) and
an optional ``frozen_layers`` (top level, else ``inputs.frozen_layers``); see ``docs/trials.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ampe.costmodel.strategy import Strategy, strategy_from_dict
from ampe.errors import InputError
from ampe.io import read_json

PLAN_SCHEMA = "ampe.plan/1"


@dataclass(frozen=True)
class Predicted:
    """The cost model's figures for one strategy (seconds, bytes, joules)."""

    iteration_s: float
    max_memory_bytes: int | None
    fits: bool | None  # None: the plan does not say
    memory_bytes_per_stage: tuple[int, ...] = ()
    energy_j: float | None = None  # per iteration, with the strategy's frequency plan when it has one
    energy_max_clock_j: float | None = None  # per iteration at maximum clocks (no schedule)


@dataclass(frozen=True)
class FrequencyPlan:
    """Per pipeline stage, one iteration of ``(instruction, micro-batch, MHz)`` in execution order; ``replicas``:
    every data-parallel replica's own stage lists when they differ (``stages`` is then replica 0's)."""

    stages: tuple[tuple[tuple[str, int, int], ...], ...]
    time_s: float | None
    energy_j: float | None
    raw: dict  # the plan's object as written, passed to the worker unchanged
    replicas: tuple[tuple[tuple[tuple[str, int, int], ...], ...], ...] | None = None

    def canonical(self) -> list | dict:
        """JSON-ready stage lists (what identifies the schedule in a trial key)."""
        stages = [[list(step) for step in stage] for stage in self.stages]
        if self.replicas is None:
            return stages
        return {"stages": stages, "replicas": [[[list(step) for step in stage] for stage in r] for r in self.replicas]}


@dataclass(frozen=True)
class PlannedStrategy:
    """One ranked strategy of the plan: what to run and what the cost model predicted for it."""

    rank: int
    strategy: Strategy
    predicted: Predicted
    frequency_plan: FrequencyPlan | None
    index: int  # position in the plan's list (for error messages)


@dataclass(frozen=True)
class TrialPlan:
    """The parts of a plan file the trial runner uses."""

    source: str
    model: str  # zoo name, or an absolute path to a model YAML (from inputs.model, else the top-level name)
    cluster: str  # cluster name as the search saw it
    cluster_spec: str | None  # absolute path to the cluster spec YAML (inputs.cluster_spec), when the plan names one
    profile: str | None  # absolute path to the profile CSV the search used (inputs.profile), if any
    global_batch: int
    frozen_layers: int
    strategies: tuple[PlannedStrategy, ...]
    raw: dict


def load_plan(path: str | Path) -> TrialPlan:
    """Read and validate a plan file. Raises :class:`InputError` (file + field) on bad input."""
    path = Path(path)
    return plan_from_dict(read_json(path), str(path), base_dir=path.resolve().parent)


def plan_from_dict(raw: Any, source: str, base_dir: Path | None = None) -> TrialPlan:
    """Validate a parsed plan; ``base_dir`` resolves relative paths (the plan file's folder)."""
    base = base_dir or Path.cwd()
    if not isinstance(raw, dict):
        raise InputError(source, "(root)", "a plan must be a JSON object")
    if raw.get("schema") != PLAN_SCHEMA:
        raise InputError(source, "schema", f"must be {PLAN_SCHEMA!r}, got {raw.get('schema')!r}")
    _string(raw, "model", source)
    cluster = _string(raw, "cluster", source)
    gbs = _positive_int(raw.get("global_batch"), source, "global_batch")
    inputs = raw.get("inputs", {})
    if not isinstance(inputs, dict):
        raise InputError(source, "inputs", "must be an object")
    model = inputs.get("model", raw["model"])  # what the search was given: a zoo name or a model YAML path
    if not isinstance(model, str) or not model:
        raise InputError(source, "inputs.model", f"must be a non-empty string, got {model!r}")
    spec = _input_path(inputs, "cluster_spec", source, base)
    profile = _input_path(inputs, "profile", source, base)
    # `ampe search --frozen-layers` records it under inputs; `ampe replan --out` also at the top level
    where = "frozen_layers" if "frozen_layers" in raw else "inputs.frozen_layers"
    frozen = raw.get("frozen_layers", inputs.get("frozen_layers", 0))
    if not isinstance(frozen, int) or isinstance(frozen, bool) or frozen < 0:
        raise InputError(source, where, f"must be an integer ≥ 0, got {frozen!r}")
    items = raw.get("strategies")
    if not isinstance(items, list) or not items:
        raise InputError(source, "strategies", "must be a non-empty list")
    planned = [_planned(item, i, source, gbs) for i, item in enumerate(items)]
    seen: dict[int, int] = {}
    for p in planned:
        if p.rank in seen:
            raise InputError(source, f"strategies[{p.index}].rank",
                             f"rank {p.rank} is already used by strategies[{seen[p.rank]}]")
        seen[p.rank] = p.index
    planned.sort(key=lambda p: p.rank)
    return TrialPlan(source=source, model=_model_ref(model, base), cluster=cluster, cluster_spec=spec,
                     profile=profile, global_batch=gbs, frozen_layers=frozen, strategies=tuple(planned), raw=raw)


def _planned(item: Any, i: int, source: str, gbs: int) -> PlannedStrategy:
    where = f"strategies[{i}]"
    if not isinstance(item, dict):
        raise InputError(source, where, "must be a JSON object")
    rank = _positive_int(item.get("rank"), source, f"{where}.rank")
    try:
        strategy = strategy_from_dict(item, source, default_gbs=gbs)
    except InputError as e:
        raise InputError(source, f"{where}.{e.field}", e.message) from None
    if strategy.gbs != gbs:
        raise InputError(source, f"{where}.gas", f"gives a global batch of {strategy.gbs}, the plan's is {gbs}")
    for key in ("partition", "placement"):
        if getattr(strategy, key) is None:
            raise InputError(source, f"{where}.{key}", "missing (trials need the exact layer partition and placement)")
    predicted = _predicted(item.get("predicted"), source, f"{where}.predicted")
    fplan = item.get("frequency_plan")
    freq = None if fplan is None else _frequency_plan(fplan, source, f"{where}.frequency_plan", strategy.pp,
                                                      strategy.dp)
    return PlannedStrategy(rank=rank, strategy=strategy, predicted=predicted, frequency_plan=freq, index=i)


def _predicted(p: Any, source: str, where: str) -> Predicted:
    if not isinstance(p, dict):
        raise InputError(source, where, "missing or not an object (needs iteration_s)")
    it = _positive_float(p.get("iteration_s"), source, f"{where}.iteration_s")
    mem = p.get("max_memory_bytes")
    if mem is not None and (not isinstance(mem, (int, float)) or isinstance(mem, bool) or not math.isfinite(mem)
                            or mem < 0):
        raise InputError(source, f"{where}.max_memory_bytes", f"must be a number of bytes ≥ 0, got {mem!r}")
    fits = p.get("fits")
    if fits is not None and not isinstance(fits, bool):
        raise InputError(source, f"{where}.fits", f"must be true or false, got {fits!r}")
    per_stage = p.get("memory_bytes_per_stage", [])
    if not isinstance(per_stage, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                  for x in per_stage):
        raise InputError(source, f"{where}.memory_bytes_per_stage", "must be a list of byte counts")
    energy = {k: _positive_float(p[k], source, f"{where}.{k}") if p.get(k) is not None else None
              for k in ("energy_j", "energy_max_clock_j")}
    return Predicted(iteration_s=it, max_memory_bytes=None if mem is None else int(mem), fits=fits,
                     memory_bytes_per_stage=tuple(int(x) for x in per_stage), **energy)


def _frequency_plan(f: Any, source: str, where: str, pp: int, dp: int) -> FrequencyPlan:
    if not isinstance(f, dict):
        raise InputError(source, where, "must be an object with `stages` (or null)")
    stages = _stage_lists(f.get("stages"), source, f"{where}.stages", pp)
    replicas = None
    if f.get("replicas") is not None:
        reps = f["replicas"]
        if not isinstance(reps, list) or len(reps) != dp:
            raise InputError(source, f"{where}.replicas", f"must be a list with one entry per data-parallel replica "
                             f"({dp})")
        for r, rep in enumerate(reps):
            if not isinstance(rep, dict):
                raise InputError(source, f"{where}.replicas[{r}]", "must be an object with `stages`")
        replicas = tuple(_stage_lists(rep.get("stages"), source, f"{where}.replicas[{r}].stages", pp)
                         for r, rep in enumerate(reps))
    time_s = f.get("time_s")
    if time_s is not None:
        time_s = _positive_float(time_s, source, f"{where}.time_s")
    energy = f.get("energy_j")
    if energy is not None:
        energy = _positive_float(energy, source, f"{where}.energy_j")
    return FrequencyPlan(stages=stages, time_s=time_s, energy_j=energy, raw=f, replicas=replicas)


def _stage_lists(stages: Any, source: str, where: str, pp: int) -> tuple[tuple[tuple[str, int, int], ...], ...]:
    """One non-empty ``[instruction, microbatch, MHz]`` list per pipeline stage (the energy planner's validator,
    :func:`ampe.energy.plan.parse_stages`); MHz as integers."""
    from ampe.energy.plan import parse_stages

    if not isinstance(stages, list) or len(stages) != pp:
        raise InputError(source, where, f"must be a list with one entry per pipeline stage ({pp})")
    parsed = parse_stages(stages, source, where)
    for j, stage in enumerate(parsed):
        if not stage:
            raise InputError(source, f"{where}[{j}]", "must be a non-empty list of [instruction, mb, MHz]")
    return tuple(tuple((instr, mb, int(round(mhz))) for instr, mb, mhz in stage) for stage in parsed)


def _string(raw: dict, key: str, source: str) -> str:
    v = raw.get(key)
    if not isinstance(v, str) or not v:
        raise InputError(source, key, f"must be a non-empty string, got {v!r}")
    return v


def _input_path(inputs: dict, key: str, source: str, base: Path) -> str | None:
    """``inputs.<key>`` as an absolute path. The search records paths as typed on its command line, so a relative
    one is looked up from the current folder first, then from the plan's folder."""
    v = inputs.get(key)
    if v is None:
        return None
    if not isinstance(v, str) or not v:
        raise InputError(source, f"inputs.{key}", f"must be a path (string) or null, got {v!r}")
    return str(_locate(v, base))


def _locate(path: str, base: Path) -> Path:
    p = Path(path)
    if p.is_absolute():
        return p
    for candidate in (Path.cwd() / p, base / p):
        if candidate.exists():
            return candidate.resolve()
    return (Path.cwd() / p).resolve()  # missing: the loader that opens it names the path


def _model_ref(model: str, base: Path) -> str:
    """Zoo names stay names; anything that looks like a file becomes an absolute path the workers can open."""
    if model.endswith((".yaml", ".yml")) or "/" in model:
        return str(_locate(model, base))
    return model


def _positive_int(v: Any, source: str, field: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise InputError(source, field, f"must be a positive integer, got {v!r}")
    return v


def _positive_float(v: Any, source: str, field: str) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
        raise InputError(source, field, f"must be a positive finite number, got {v!r}")
    return float(v)
