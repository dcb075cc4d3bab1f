"""Reading plan files back: their inputs (cluster spec, model, profile) and one strategy."""

from __future__ import annotations

from pathlib import Path

from ampe.costmodel.cluster import Cluster, load_cluster
from ampe.costmodel.model import Model
from ampe.costmodel.profile import Profile, load_profile
from ampe.costmodel.strategy import Strategy, strategy_from_dict, validate
from ampe.costmodel.zoo import load_model
from ampe.errors import InputError
from ampe.formats.plan import PlanFile, load_plan_file
from ampe.io import exists


def _resolve(path: str, plan_path: str) -> str:
    """Paths in a plan are as the user typed them; try them as given, then relative to the plan file."""
    p = Path(path)
    if exists(p) or p.is_absolute():
        return str(p)
    alt = Path(plan_path).parent / p
    return str(alt) if exists(alt) else str(p)


def spec_path(doc: PlanFile, plan_path: str) -> str:
    """The cluster spec a plan was made for, resolved as :func:`load_plan_inputs` reads it."""
    if not doc.inputs.cluster_spec:
        raise InputError(plan_path, "inputs.cluster_spec", "missing: the plan does not say which cluster spec it "
                         "was made for")
    return _resolve(doc.inputs.cluster_spec, plan_path)


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
    cluster = load_cluster(_resolve(inputs.cluster_spec, plan_path))
    model = load_model(inputs.model or doc.model, inputs.attention, seq_len=inputs.seq_len,
                       seq_len_from=(plan_path, "inputs.seq_len")).with_tf32(bool(inputs.tf32))
    profile = None
    if inputs.profile:
        profile = load_profile(_resolve(inputs.profile, plan_path), [g.name for g in cluster.gpu_types()])
    return doc, cluster, model, profile


def strategy_at_rank(doc: PlanFile, plan_path: str, rank: int, cluster: Cluster, model: Model) -> Strategy:
    """The strategy with ``rank`` in the plan, validated against the cluster and model."""
    for i, entry in enumerate(doc.strategies):
        if entry.rank == rank:
            s = strategy_from_dict(entry.model_dump(), plan_path, doc.global_batch)
            try:
                return validate(s, cluster.size, model.num_layers, plan_path)
            except InputError as e:
                raise InputError(plan_path, f"strategies[{i}].{e.field}", e.message) from None
    raise InputError(plan_path, "strategies", f"no strategy with rank {rank}")
