"""Reading plan files back: their inputs (cluster spec, model, profile) and one strategy."""

from __future__ import annotations

from typing import Any

from ampe.costmodel.cluster import Cluster, load_cluster
from ampe.costmodel.model import Model
from ampe.costmodel.plan_entry import entry_frozen, entry_problem
from ampe.costmodel.profile import Profile, load_profile
from ampe.costmodel.strategy import Strategy, strategy_from_dict, validate
from ampe.costmodel.zoo import load_model
from ampe.errors import InputError
from ampe.formats.plan import PlanFile, load_plan_file
from ampe.formats.plan_inputs import check_unchanged, file_inputs, input_path, model_names_file, recorded_inputs
from ampe.io import write_json_atomic


def _resolve(path: str, plan_path: str, doc: PlanFile) -> str:
    """A path a plan records, where it is: against the plan's own folder (:mod:`ampe.formats.plan_inputs`)."""
    return input_path(path, plan_path, doc.inputs.relative_to)


def plan_input_files(doc: PlanFile, plan_path: str) -> list[tuple[str, str]]:
    """(``inputs.FIELD``, path) of every input file the plan names, resolved as it is read."""
    return [(f"{plan_path}: inputs.{field}", path)
            for field, path in file_inputs(doc.inputs.model_dump(exclude_none=True), plan_path)]


def check_outputs_over_plan(args: Any, doc: PlanFile, plan_path: str, extra: tuple[tuple[str, str], ...] = ()
                            ) -> None:
    """Refuse any output of the running command (its declared files, and ``extra`` (flag, name) pairs) that is one
    of the input files the plan names: known only once the plan is read, so checked here, before any work."""
    from ampe.cli._paths import COMMANDS, check_not_input

    read = plan_input_files(doc, plan_path)
    paths = COMMANDS.get(getattr(args, "command", "") or "")
    outs = [(o.flag, str(getattr(args, o.attr))) for o in (paths.outputs if paths else ())
            if o.kind != "folder" and getattr(args, o.attr, None) is not None]
    for flag, name in (*outs, *extra):
        check_not_input(flag, name, read)


def plan_profile_path(doc: PlanFile, plan_path: str) -> str | None:
    """The profile a plan names, resolved as it is read; None when it names none."""
    return _resolve(doc.inputs.profile, plan_path, doc) if doc.inputs.profile else None


def write_plan(path: str, plan: dict[str, Any]) -> None:
    """Write a plan's JSON to ``path`` (or ``-``) with its inputs recorded relative to its own folder, with their
    hashes (:func:`ampe.formats.plan_inputs.recorded_inputs`)."""
    plan = {**plan, "inputs": recorded_inputs(plan.get("inputs") or {}, path)}
    write_json_atomic(path, plan)


def spec_path(doc: PlanFile, plan_path: str) -> str:
    """The cluster spec a plan was made for, resolved as :func:`load_plan_inputs` reads it."""
    if not doc.inputs.cluster_spec:
        raise InputError(plan_path, "inputs.cluster_spec", "missing: the plan does not say which cluster spec it "
                         "was made for")
    return _resolve(doc.inputs.cluster_spec, plan_path, doc)


def check_devices(doc: PlanFile, plan_path: str, cluster: Cluster) -> None:
    """InputError unless the plan's ``devices`` (when it lists them) are ``cluster``'s: the spec it names has not
    changed since the plan was made."""
    if not doc.devices:
        return
    have = [(d.id, d.node, d.gpu.name) for d in cluster.devices]
    want = [(d.id, d.node, d.gpu) for d in doc.devices]
    if have != want:
        first = next((i for i, (a, b) in enumerate(zip(have, want, strict=False)) if a != b), min(len(have), len(want)))
        raise InputError(plan_path, f"devices[{first}]", f"the plan's {len(want)} devices differ from its cluster "
                         f"spec's {len(have)} now ({cluster.source}): the spec changed since the plan was made")


def load_plan_inputs(plan_path: str) -> tuple[PlanFile, Cluster, Model, Profile | None]:
    """Validate a plan file and load the cluster, model and profile it was made from."""
    doc = load_plan_file(plan_path)
    inputs = doc.inputs
    if not inputs.cluster_spec:
        raise InputError(plan_path, "inputs.cluster_spec", "missing: the plan does not say which cluster spec it "
                         "was made for")
    check_unchanged(inputs.model_dump(exclude_none=True), plan_path)
    cluster = load_cluster(_resolve(inputs.cluster_spec, plan_path, doc))
    model_ref = inputs.model or doc.model
    if inputs.model and model_names_file(inputs.model):
        model_ref = _resolve(inputs.model, plan_path, doc)
    model = load_model(model_ref, inputs.attention, seq_len=inputs.seq_len,
                       seq_len_from=(plan_path, "inputs.seq_len")).with_tf32(bool(inputs.tf32))
    profile = None
    if inputs.profile:
        profile = load_profile(_resolve(inputs.profile, plan_path, doc), [g.name for g in cluster.gpu_types()])
    return doc, cluster, model, profile


def strategy_at_rank(doc: PlanFile, plan_path: str, rank: int, cluster: Cluster, model: Model) -> Strategy:
    """The strategy with ``rank`` in the plan, validated against the cluster and model."""
    for i, entry in enumerate(doc.strategies):
        if entry.rank == rank:
            s = strategy_from_dict(entry.model_dump(), plan_path, doc.global_batch)
            try:
                s = validate(s, cluster.size, model.num_layers, plan_path)
            except InputError as e:
                raise InputError(plan_path, f"strategies[{i}].{e.field}", e.message) from None
            problem = entry_problem(entry.frozen_layers, entry.frequency_plan, s, cluster, model.num_layers)
            if problem is not None:
                raise InputError(plan_path, f"strategies[{i}].{problem[0]}", problem[1])
            inherited = entry_frozen(doc, entry)
            if entry.frozen_layers is None and inherited > model.num_layers:  # the plan's prefix, the entry's too
                field = "frozen_layers" if doc.frozen_layers is not None else "inputs.frozen_layers"
                raise InputError(plan_path, field, f"{inherited} frozen layers but the model has {model.num_layers}")
            return s
    raise InputError(plan_path, "strategies", f"no strategy with rank {rank}")
