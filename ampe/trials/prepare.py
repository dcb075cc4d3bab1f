"""What one ``ampe trial`` invocation runs: its options, the plan's strategies validated against the cluster and
listed as trials (each with its key, id, backend and predicted time), and the strategies left out as ``skipped``
records (:func:`prepare`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ampe.costmodel.cluster import Cluster, load_cluster
from ampe.costmodel.model import Model
from ampe.costmodel.plan_entry import entry_frozen, entry_problem
from ampe.costmodel.runnable import runtime_problems, schedule_problems
from ampe.costmodel.strategy import Strategy, validate
from ampe.costmodel.zoo import load_model
from ampe.errors import InputError
from ampe.formats.frequency_plan import FrequencyPlan
from ampe.formats.plan_inputs import check_file_unchanged, content_hash
from ampe.formats.trial import TrialResult
from ampe.jitops import QUIET_S
from ampe.trials.commands import LAUNCHERS
from ampe.trials.planfile import PlannedStrategy, TrialPlan, load_plan, schedule_key
from ampe.trials.results import trial_key
from ampe.trials.worker_ref import worker_ref

FREQ_BACKENDS = ("auto", "nvml", "emulate", "none")


@dataclass(frozen=True)
class TrialOptions:
    """How to run the trials. Times in seconds, memory in bytes."""

    out_dir: Path
    top_k: int = 10
    budget_s: float | None = None  # wall-clock limit for this invocation's trials (None: no limit)
    freq_backend: str = "auto"  # auto | nvml | emulate | none
    timeout_s: float = 600.0  # per trial
    warmup_iters: int = 3
    timed_iters: int = 10
    launcher: str = "auto"  # auto | torchrun | deepspeed | local
    memory_limit_bytes: int | None = None  # per rank (RLIMIT_AS), CPU trials only
    startup_s: float = 30.0  # first guess of a trial's start-up overhead, refined by measurements
    worker: str = "ampe.runtime.worker"  # module, or a path to a .py script
    retry_failed: bool = False  # rerun crashed/killed/timed-out trials found in the results folder
    run_unfit: bool = False  # also run strategies the cost model says do not fit in memory
    baseline: bool = True  # with a frequency schedule, also run the strategy without it
    dtype: str | None = None  # default: fp32 on CPU, the model's dtype on GPUs
    seed: int = 0
    # CPU: ranks of slower device types stretch their computations by the type's speed ratio (docs/trials.md)
    emulate_speed: bool = False
    cluster_spec: str | None = None  # overrides the plan's cluster_spec
    # trains this model instead of the plan's (as many layers: the plan's partitions apply), with every prediction
    # redone for it without the plan's profile: a scaled-down copy tries a GPU cluster's plan on a small machine
    model: str | None = None
    host_map: Mapping[str, str] = field(default_factory=dict)  # cluster node name → hostname (DeepSpeed launcher)
    env: Mapping[str, str] = field(default_factory=dict)  # extra environment for every rank
    poll_s: float = 0.1
    kill_grace_s: float = 5.0  # SIGTERM → SIGKILL delay when stopping a trial
    fail_grace_s: float = 3.0  # local launcher: time other ranks get to report after one fails
    prebuild: bool = True  # CPU trials: build DeepSpeed's CPU op before any rank starts (ampe.runtime.prebuild)
    quiet_s: float = QUIET_S  # CPU trials: how long a build lock no process holds must stay so before it is cleared
    # The ranks build ampe's own layers (`ampe trial`): a strategy they cannot shard is skipped. False for an
    # export, whose script may bring its own layers: only the schedule must be DeepSpeed's
    own_layers: bool = True
    # Adaptive order: (plan, cluster, results so far, trials still to run) → Rerank; None keeps the plan's order
    rerank: Callable[[TrialPlan, Cluster, Sequence[TrialResult], Sequence[PlannedTrial]], Rerank] | None = None


@dataclass(frozen=True)
class Rerank:
    """A reranker's decision: the keys of the trials still to run, in the order to run them, and a reason to stop
    (the rest are skipped) or None."""

    order: tuple[str, ...]
    stop_reason: str | None = None


@dataclass(frozen=True)
class PlannedTrial:
    """One trial to run: a strategy with one frequency backend (and its schedule, if any)."""

    key: str
    trial_id: str
    planned: PlannedStrategy
    strategy: Strategy  # validated and completed
    backend: str  # effective: "none" when no schedule is applied
    schedule: FrequencyPlan | None
    predicted_s: float  # predicted iteration time of what runs (the schedule's time when one is applied)
    baseline_key: str | None  # for a scheduled trial, its twin without the schedule


@dataclass(frozen=True)
class RunContext:
    """Everything fixed for one invocation: the plan, the cluster, the device kind, the options."""

    plan: TrialPlan
    cluster: Cluster
    device: str  # "cpu" | "cuda"
    dtype: str
    backend: str  # resolved frequency backend
    options: TrialOptions
    attention: str = "eager"  # the plan's attention kernel (the model's default when the plan names none)
    cache: dict[str, Any] = field(default_factory=dict, compare=False)  # the cost model, when a trial needs one
    mark: str | None = None  # what the trial processes carry (ampe.trials.lifetime), once the folder is claimed


def prepare(plan: TrialPlan | str | Path, options: TrialOptions) -> tuple[RunContext, list[PlannedTrial],
                                                                             list[TrialResult]]:
    """Load what the plan names, validate it, and list the trials to run plus the strategies left out (as
    ``skipped`` results). Raises :class:`InputError` for a bad plan or bad options."""
    _check_options(options)
    if not isinstance(plan, TrialPlan):
        plan = load_plan(plan)
    spec = options.cluster_spec or plan.cluster_spec
    if not spec:
        raise InputError(plan.source, "cluster_spec", "missing: the plan does not name its cluster spec (give "
                         "--cluster SPEC.yaml)")
    if not options.cluster_spec:  # the plan's own spec: unchanged since the plan was made
        check_file_unchanged(plan.source, "cluster_spec", spec, (plan.file.inputs.sha256 or {}).get("cluster_spec"))
    cluster = load_cluster(spec)
    # another cluster's GPU types are refused, except for a run of the plan's shape with another model (--model),
    # which is re-predicted there and runs without the plan's clocks (they are another card's)
    other = _other_types(plan, cluster) if options.cluster_spec else []
    foreign = bool(other)
    if foreign and options.model is None:
        _refuse_other_types(plan, cluster, other)
    model = load_model(plan.model, plan.attention, seq_len=plan.seq_len,
                       seq_len_from=(plan.source, "inputs.seq_len"))
    if options.model is not None:
        plan, model = _instead(plan, model, options.model)
    if plan.frozen_layers > model.num_layers:
        raise InputError(plan.source, "frozen_layers", f"{plan.frozen_layers} frozen layers but {model.name} has "
                         f"{model.num_layers}")
    device = _device_kind(cluster, spec)
    if options.emulate_speed and device == "cuda":
        raise InputError("--emulate-speed", "", "stretches CPU ranks to emulate slower device types; this plan's "
                         "devices are GPUs, which run at their own speed")
    if options.memory_limit_bytes and device == "cuda":
        raise InputError("--memory-limit", "", "an address-space limit breaks CUDA (it reserves huge virtual "
                         "ranges); GPU trials are limited by the GPUs' own memory")
    dtype = options.dtype or ("fp32" if device == "cpu" else model.dtype)
    backend = trial_backend(options.freq_backend, device, plan)
    ctx = RunContext(plan, cluster, device, dtype, backend, options, model.attention)

    trials: list[PlannedTrial] = []
    left_out: list[TrialResult] = []
    chosen = 0
    for ps in plan.strategies:
        if chosen >= options.top_k:
            break
        try:
            strategy = validate(ps.strategy, cluster.size, model.num_layers, plan.source)
        except InputError as e:
            raise InputError(plan.source, f"strategies[{ps.index}].{e.field}", e.message) from None
        if foreign or options.model is not None:  # the plan's clocks are another card's or another model's
            ps = replace(ps, frequency_plan=None)
        _check_entry(plan, ps, strategy, cluster, model.num_layers)
        # what the trial runs, named in every record: the entry's attention kernel (else the plan's), this run's
        # precision, and TF32 as the entry (else the plan) says
        costed = (strategy.attention or ctx.attention, strategy.dtype or model.dtype)
        tf32 = strategy.tf32 if strategy.tf32 is not None else plan.tf32
        strategy = replace(strategy, attention=strategy.attention or ctx.attention, dtype=dtype, tf32=tf32)
        if costed != (strategy.attention, dtype) or options.model is not None:  # predict what runs (fp32 on CPU)
            ps = _predicted_as_run(ctx, ps, strategy)
        if not ps.within_capacity and not options.run_unfit:
            left_out.append(skipped_result(ctx, planned_trial(ctx, ps, strategy, "none", None, None),
                                     "predicted not to fit in memory (--run-unfit runs it anyway)"))
            continue
        problems = runtime_problems(strategy, model) if options.own_layers else schedule_problems(strategy)
        if problems:  # never launch what the worker would refuse or DeepSpeed would run as something else
            left_out.append(skipped_result(ctx, planned_trial(ctx, ps, strategy, "none", None, None),
                                           f"not runnable by ampe's worker: {'; '.join(problems)}"))
            continue
        chosen += 1
        if backend != "none" and ps.frequency_plan is not None:
            base = planned_trial(ctx, ps, strategy, "none", None, None)
            if options.baseline:
                trials.append(base)
            trials.append(planned_trial(ctx, ps, strategy, backend, ps.frequency_plan, base.key))
        else:
            trials.append(planned_trial(ctx, ps, strategy, "none", None, None))
    return ctx, trials, left_out


def _instead(plan: TrialPlan, planned: Model, name: str) -> tuple[TrialPlan, Model]:
    """The plan with ``name`` (``--model``) as its model and no profile (it was measured for the plan's model), and
    that model. Raises InputError unless it has as many layers as the plan's (its partitions index them)."""
    model = load_model(name)
    if model.num_layers != planned.num_layers:
        raise InputError("--model", "", f"{model.name} has {model.num_layers} layers and the plan's {planned.name} "
                         f"{planned.num_layers}: the plan's partitions need as many (a model YAML with `base: "
                         f"{planned.name}` keeps them)")
    path = Path(name)
    ref = str(path.resolve()) if path.suffix in (".yaml", ".yml", ".json") else name
    return replace(plan, model=ref, profile=None, seq_len=None, attention=None), model


def _device_kind(cluster: Cluster, spec: str) -> str:
    """``cpu`` or ``cuda``: what the cluster's devices are (a straggler as its healthy type); InputError for a mix."""
    cores = {d.gpu.healthy().is_cpu for d in cluster.devices}
    if cores == {True}:
        return "cpu"
    if True in cores:
        raise InputError(spec, "nodes", "mixes CPU and GPU devices; trials need one kind")
    return "cuda"


def _made_for(plan: TrialPlan) -> set[str]:
    """The GPU types the plan was made for (a straggler as its healthy type; none for an older plan without
    devices)."""
    return {d.gpu.split(" slow×")[0] for d in plan.file.devices}


def _other_types(plan: TrialPlan, cluster: Cluster) -> list[str]:
    """The GPU types of ``cluster`` (a straggler as its healthy type) the plan was not made for (none for an older
    plan, which lists no devices)."""
    if not plan.file.devices:
        return []
    return sorted({d.gpu.healthy().name for d in cluster.devices} - _made_for(plan))


def _refuse_other_types(plan: TrialPlan, cluster: Cluster, other: list[str]) -> None:
    """Refuse a ``--cluster`` with GPU types ``other`` the plan was not made for — a CPU plan on GPUs, V100 clocks on
    another card: its times, memory and clocks would not hold there."""
    raise InputError("--cluster", "", f"{cluster.source} has GPU type(s) {', '.join(other)} the plan was not made "
                     f"for (it was made for {', '.join(sorted(_made_for(plan)))}); plan for it with ampe search")


def trial_backend(requested: str, device: str, plan: TrialPlan) -> str:
    """``auto``: nvml on GPUs, emulate on CPUs — when the plan has frequency schedules at all; else none. ``nvml`` on
    CPU devices is refused (it sets GPU clocks)."""
    if requested == "nvml" and device == "cpu":
        raise InputError("--freq-backend", "", "nvml sets GPU clocks; this plan's devices are CPUs (use emulate or "
                         "none)")
    if requested != "auto":
        return requested
    if not any(p.frequency_plan is not None for p in plan.strategies):
        return "none"
    return "nvml" if device == "cuda" else "emulate"


def resolved_plan(ctx: RunContext) -> dict[str, Any]:
    """The plan as written, with the paths it names made absolute (the copy kept in the results folder must still
    find the cluster spec, model and profile; ``cluster_spec`` is the one the trials used)."""
    raw = dict(ctx.plan.raw)
    inputs = dict(raw.get("inputs") or {})
    inputs.update(cluster_spec=str(Path(ctx.cluster.source).resolve()), model=ctx.plan.model,
                  profile=ctx.plan.profile)
    if inputs.get("sha256"):  # the spec the trials used (--cluster may have replaced the plan's)
        digest = content_hash(inputs["cluster_spec"])
        inputs["sha256"] = {k: v for k, v in {**inputs["sha256"], "cluster_spec": digest}.items() if v}
    raw["inputs"] = inputs
    return raw


def _check_options(o: TrialOptions) -> None:
    if o.freq_backend not in FREQ_BACKENDS:
        raise InputError("--freq-backend", "", f"must be one of {', '.join(FREQ_BACKENDS)}, got {o.freq_backend!r}")
    if o.launcher not in ("auto", *LAUNCHERS):
        raise InputError("--launcher", "", f"must be auto or one of {', '.join(LAUNCHERS)}, got {o.launcher!r}")
    for name in ("top_k", "timed_iters"):
        if getattr(o, name) < 1:
            raise InputError(f"--{name.replace('_', '-')}", "", "must be ≥ 1")
    if o.warmup_iters < 0:
        raise InputError("--warmup", "", "must be ≥ 0")
    if not o.timeout_s > 0:
        raise InputError("--timeout", "", "must be > 0 seconds")
    if o.budget_s is not None and not o.budget_s > 0:
        raise InputError("--budget", "", "must be > 0 seconds")
    if o.dtype not in (None, "fp32", "bf16", "fp16"):
        raise InputError("--dtype", "", f"must be fp32, bf16 or fp16, got {o.dtype!r}")
    worker_ref(o.worker)


def _predicted_as_run(ctx: RunContext, ps: PlannedStrategy, s: Strategy) -> PlannedStrategy:
    """``ps`` with its time, memory and fit predicted for how ``s`` runs (another precision or attention kernel than
    the plan entry was costed with), from the plan's cluster and profile (the energy figures and any frequency plan
    stay the entry's). The report makes the same re-prediction (``report.compare``)."""
    from ampe.costmodel.estimate import CostModel

    if "cost_model" not in ctx.cache:
        ctx.cache["cost_model"] = CostModel(ctx.cluster, *ctx.plan.cost_inputs(ctx.cluster))
    est = ctx.cache["cost_model"].estimate(s)
    update = {"iteration_s": est.iteration_s, "max_memory_bytes": est.max_memory_bytes, "fits": est.fits}
    caveats = tuple(c for c in ps.caveats if c.kind != "memory_at_risk") + est.caveats
    return replace(ps, predicted=ps.predicted.model_copy(update=update), caveats=caveats)


def _check_entry(plan: TrialPlan, ps: PlannedStrategy, strategy: Strategy, cluster: Cluster, num_layers: int
                 ) -> None:
    """InputError naming the entry and field for an entry that cannot run as planned: its frozen prefix or clocks
    (:func:`entry_problem`), or a frozen prefix other than the plan's (a trial runs the plan's one prefix: an entry
    costed with another would be measured against a prediction of something else)."""
    entry = plan.file.strategies[ps.index]
    problem = entry_problem(entry.frozen_layers, ps.frequency_plan, strategy, cluster, num_layers)
    frozen = entry_frozen(plan.file, entry)
    if problem is None and frozen != plan.frozen_layers:
        problem = ("frozen_layers", f"{frozen} differs from the plan's {plan.frozen_layers}: a plan runs with one "
                   "frozen prefix (trial, export); split the plan")
    if problem is not None:
        raise InputError(plan.source, f"strategies[{ps.index}].{problem[0]}", problem[1])


def planned_trial(ctx: RunContext, ps: PlannedStrategy, s: Strategy, backend: str, schedule: FrequencyPlan | None,
           baseline_key: str | None) -> PlannedTrial:
    o = ctx.options
    key = trial_key({"model": ctx.plan.model, "cluster": ctx.cluster.name, "strategy": s.to_dict(),
                     "backend": backend, "schedule": schedule_key(schedule) if schedule else None,
                     "warmup": o.warmup_iters, "iters": o.timed_iters, "dtype": ctx.dtype, "device": ctx.device,
                     "frozen_layers": ctx.plan.frozen_layers, "seed": o.seed,
                     **({"emulate_speed": True} if o.emulate_speed else {})})
    tid = f"r{ps.rank:03d}-pp{s.pp}dp{s.dp}tp{s.tp}-mbs{s.mbs}-{backend}-{key[:8]}"
    predicted = schedule.time_s if schedule is not None and schedule.time_s else ps.predicted.iteration_s
    return PlannedTrial(key, tid, ps, s, backend, schedule, predicted, baseline_key)


def trial_identity(ctx: RunContext, t: PlannedTrial) -> dict[str, Any]:
    p = t.planned.predicted
    if t.schedule is not None:
        energy = t.schedule.energy_j or p.energy_j
    elif t.planned.frequency_plan is not None:  # the baseline of a scheduled strategy runs at maximum clocks
        energy = p.energy_max_clock_j
    else:
        energy = p.energy_j if p.energy_j is not None else p.energy_max_clock_j
    return dict(key=t.key, trial_id=t.trial_id, plan_rank=t.planned.rank, strategy=t.strategy.to_dict(),
                model=ctx.plan.model, cluster=ctx.cluster.name, freq_backend=t.backend,
                schedule_applied=t.schedule is not None, warmup_iters=ctx.options.warmup_iters,
                timed_iters=ctx.options.timed_iters, predicted_iteration_s=t.predicted_s,
                predicted_max_memory_bytes=p.max_memory_bytes, predicted_fits=p.fits, predicted_energy_j=energy,
                predicted_caveats=t.planned.caveats, baseline_key=t.baseline_key)


def skipped_result(ctx: RunContext, t: PlannedTrial, reason: str) -> TrialResult:
    return TrialResult(**trial_identity(ctx, t), status="skipped", reason=reason)
