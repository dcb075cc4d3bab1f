"""The trial runner's view of a plan file: :class:`~ampe.formats.plan.PlanFile` (validated there, the same model
``ampe search`` writes with) plus what the runner derives — completed strategies and absolute input paths.

The runner takes the cluster spec, model and profile from the plan's ``inputs`` (as ``ampe search`` records them) and
an optional ``frozen_layers`` (top level, else ``inputs.frozen_layers``); see ``docs/trials.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ampe.costmodel.cluster import Cluster
from ampe.costmodel.model import Model
from ampe.costmodel.profile import Profile, load_profile
from ampe.costmodel.strategy import Strategy, strategy_from_dict
from ampe.costmodel.zoo import load_model
from ampe.errors import InputError
from ampe.formats.frequency_plan import FrequencyPlan
from ampe.formats.plan import PLAN_SCHEMA, Caveat, PlanFile, Predicted, plan_from_json
from ampe.formats.plan_inputs import check_unchanged, input_path, model_names_file
from ampe.io import path_problem, read_json

__all__ = ["PLAN_SCHEMA", "PlannedStrategy", "TrialPlan", "load_plan", "plan_from_dict", "schedule_key"]


@dataclass(frozen=True)
class PlannedStrategy:
    """One ranked strategy of the plan: what to run and what the cost model predicted for it."""

    rank: int
    strategy: Strategy
    predicted: Predicted
    frequency_plan: FrequencyPlan | None
    index: int  # position in the plan's list (for error messages)
    caveats: tuple[Caveat, ...] = ()  # why it may not run as planned (memory at risk, not runnable)

    @property
    def within_capacity(self) -> bool:
        """Whether the plan predicts every device's footprint within its capacity: it fits, or is at risk (a trial
        of it is worth running: it says which)."""
        return self.predicted.fits is not False or any(c.kind == "memory_at_risk" for c in self.caveats)


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
    file: PlanFile
    attention: str | None = None  # the attention kernel the plan was costed with (inputs.attention); None: the model's
    seq_len: int | None = None  # a Hugging Face config's sequence length the plan was costed at (inputs.seq_len)
    tf32: bool | None = None  # whether the plan let fp32 products run as TF32 (inputs.tf32); None: an older plan

    def cost_inputs(self, cluster: Cluster) -> tuple[Model, Profile | None]:
        """What the plan was costed with, on ``cluster``: the model as trained (the plan's attention kernel, its
        frozen prefix) and the profile (None without one). Raises InputError for an unreadable model or profile."""
        model = load_model(self.model, self.attention, seq_len=self.seq_len,
                           seq_len_from=(self.source, "inputs.seq_len")).with_tf32(bool(self.tf32))
        profile = load_profile(self.profile, known_devices=[g.name for g in cluster.gpu_types()]) \
            if self.profile else None
        return (model.with_frozen_prefix(self.frozen_layers) if self.frozen_layers else model), profile

    @property
    def raw(self) -> dict[str, Any]:
        """The plan as JSON (what the results folder keeps a copy of)."""
        return self.file.to_json()


def schedule_key(plan: FrequencyPlan) -> list | dict:
    """JSON-ready stage lists that identify a frequency schedule in a trial key."""
    stages = [[list(step) for step in stage] for stage in plan.stages]
    if plan.replicas is None:
        return stages
    key: dict[str, Any] = {"stages": stages,
                           "replicas": [[[list(step) for step in stage] for stage in r.stages] for r in plan.replicas]}
    if plan.replica_plan is not None:
        key["replica_plan"] = list(plan.replica_plan)
    return key


def load_plan(path: str | Path) -> TrialPlan:
    """Read and validate a plan file. Raises :class:`InputError` (file + field) on bad input."""
    path = Path(path)
    return plan_from_dict(read_json(path), str(path), base_dir=path.resolve().parent)


def plan_from_dict(raw: Any, source: str, base_dir: Path | None = None) -> TrialPlan:
    """Validate a parsed plan; ``base_dir`` resolves relative paths (the plan file's folder)."""
    base = base_dir or Path.cwd()
    doc = plan_from_json(raw, source)
    if not doc.strategies:
        raise InputError(source, "strategies", "must be a non-empty list")
    inputs = doc.inputs
    model = inputs.model or doc.model  # what the search was given: a zoo name or a model YAML path
    frozen = doc.frozen_layers if doc.frozen_layers is not None else (inputs.frozen_layers or 0)
    planned = []
    for i, entry in enumerate(doc.strategies):
        strategy = strategy_from_dict(entry.model_dump(), source, default_gbs=doc.global_batch)
        planned.append(PlannedStrategy(rank=entry.rank, strategy=strategy, predicted=entry.predicted,
                                       frequency_plan=entry.frequency_plan, index=i, caveats=tuple(entry.caveats)))
    planned.sort(key=lambda p: p.rank)
    relative_to = inputs.relative_to
    # the cluster spec is checked where it is loaded (prepare_trials), unless --cluster replaces it
    check_unchanged(inputs.model_dump(exclude_none=True), str(base / Path(source).name), skip=("cluster_spec",))
    return TrialPlan(source=source, model=_model_ref(model, base, relative_to), cluster=doc.cluster,
                     cluster_spec=_input_path(inputs.cluster_spec, base, relative_to),
                     profile=_input_path(inputs.profile, base, relative_to),
                     global_batch=doc.global_batch, frozen_layers=frozen, strategies=tuple(planned), file=doc,
                     attention=inputs.attention, seq_len=inputs.seq_len, tf32=inputs.tf32)


def _input_path(value: str | None, base: Path, relative_to: str | None) -> str | None:
    """An input path as absolute, found against the plan's own folder (:func:`ampe.formats.plan_inputs.input_path`)."""
    if not value:
        return None
    return str(_locate(value, base, relative_to))


def _locate(path: str, base: Path, relative_to: str | None) -> Path:
    bad = path_problem(path)
    if bad:  # resolve() itself raises for a NUL byte: say why here, naming the path
        raise InputError(path, "", f"not a usable file name: {bad}")
    return Path(input_path(path, str(base / "plan.json"), relative_to)).resolve()


def _model_ref(model: str, base: Path, relative_to: str | None) -> str:
    """Zoo names stay names; anything that looks like a file becomes an absolute path the workers can open."""
    if model_names_file(model):
        return str(_locate(model, base, relative_to))
    return model
