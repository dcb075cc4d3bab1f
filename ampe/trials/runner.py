"""The trial runner: launch the top-k strategies of a plan as real training runs, in predicted order.

``run_trials(plan, options) -> list[TrialResult]`` is the whole API. For every strategy it writes a job file
(``ampe.job/1``, see ``docs/trials.md``), starts the worker's ranks (torchrun on one host, the DeepSpeed launcher
across hosts, or the runner's own ``local`` launcher), shows progress, enforces the trial timeout and the overall
budget, classifies failures (out of memory, crash, killed rank, hang) and appends each finished trial to the results
folder at once, so a rerun resumes where the last one stopped.

Budget: before a trial starts, its expected cost is

    expected = startup + (warmup + timed) × predicted_iteration_s × ratio

where ``startup`` starts at ``options.startup_s`` and becomes the median start-up overhead measured so far
(wall time − iterations × measured iteration time), and ``ratio`` starts at 1 and becomes the median of
measured / predicted iteration time over the trials measured so far. A trial whose expected cost exceeds the budget
left is skipped (later, cheaper ones may still run), and a trial that runs is killed when the budget runs out.

DeepSpeed's CPU op: before the first rank of a CPU run starts, ``python -m ampe.runtime.prebuild`` builds it once
under ampe's kernel lock, in the folder every rank gets as ``TORCH_EXTENSIONS_DIR`` (:mod:`ampe.trials.buildlock`),
and before each trial a torch build lock whose builder is gone is cleared, so no trial waits on a dead build.

Adaptive order (``options.rerank``): after each measured trial the runner asks the reranker for the order of the
trials still to run, and runs its first next; when the reranker says no remaining strategy can beat the best
measured one, the rest are recorded as ``skipped`` with its reason. The reranker is given from outside (``ampe trial
--budget`` passes the calibrated one of :mod:`ampe.report.adaptive`), so the runner needs no cost-model fitting.
"""

from __future__ import annotations

import datetime as _dt
import os
import shutil
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ampe.blas import launch_environ
from ampe.costmodel.cluster import Cluster, load_cluster
from ampe.costmodel.model import load_model
from ampe.costmodel.strategy import Strategy, validate
from ampe.errors import InputError
from ampe.formats.frequency_plan import FrequencyPlan
from ampe.formats.job import JobFile
from ampe.formats.trial import TrialResult
from ampe.io import write_json_atomic, write_text_atomic
from ampe.jitops import deepspeed_installed
from ampe.search.plan import runtime_support
from ampe.trials import process
from ampe.trials.buildlock import lock_advice, prebuild, stale_locks, sweep
from ampe.trials.commands import (
    LAUNCHERS,
    Launch,
    base_env,
    deepspeed_argv,
    deepspeed_env_text,
    free_port,
    local_rank_env,
    torchrun_argv,
    worker_args,
)
from ampe.trials.hostfile import UnrealizablePlacementError, host_layout, nodes_used
from ampe.trials.outcome import classify, read_progress
from ampe.trials.planfile import PlannedStrategy, TrialPlan, load_plan, schedule_key
from ampe.trials.progress import ProgressView, SilentView
from ampe.trials.results import ResultsStore, trial_key
from ampe.trials.worker_ref import worker_ref

FREQ_BACKENDS = ("auto", "nvml", "emulate", "none")
LOG_TAIL_BYTES = 64 * 1024


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
    cluster_spec: str | None = None  # overrides the plan's cluster_spec
    host_map: Mapping[str, str] = field(default_factory=dict)  # cluster node name → hostname (DeepSpeed launcher)
    env: Mapping[str, str] = field(default_factory=dict)  # extra environment for every rank
    poll_s: float = 0.1
    kill_grace_s: float = 5.0  # SIGTERM → SIGKILL delay when stopping a trial
    fail_grace_s: float = 3.0  # local launcher: time other ranks get to report after one fails
    prebuild: bool = True  # CPU trials: build DeepSpeed's CPU op before any rank starts (ampe.runtime.prebuild)
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


class TrialsInterrupted(KeyboardInterrupt):
    """SIGINT/SIGTERM stopped the run; ``results`` holds every trial finished before (and the interrupted one)."""

    def __init__(self, results: list[TrialResult]) -> None:
        super().__init__("interrupted")
        self.results = results


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
    cluster = load_cluster(spec)
    model = load_model(plan.model, plan.attention)
    if plan.frozen_layers > model.num_layers:
        raise InputError(plan.source, "frozen_layers", f"{plan.frozen_layers} frozen layers but {model.name} has "
                         f"{model.num_layers}")
    types = {d.gpu.healthy().name for d in cluster.devices}  # a straggler is its healthy type here
    if types == {"cpu"}:
        device = "cpu"
    elif "cpu" in types:
        raise InputError(spec, "nodes", "mixes CPU and GPU devices; trials need one kind")
    else:
        device = "cuda"
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
        # what the trial runs, named in every record: the entry's attention kernel (else the plan's) and this
        # run's precision
        costed = (strategy.attention or ctx.attention, strategy.dtype or model.dtype)
        strategy = replace(strategy, attention=strategy.attention or ctx.attention, dtype=dtype)
        if costed != (strategy.attention, dtype):  # e.g. a CPU trial (fp32) of a bf16 plan: predict what runs
            ps = _predicted_as_run(ctx, ps, strategy)
        if ps.predicted.fits is False and not options.run_unfit:
            left_out.append(_skipped(ctx, _trial(ctx, ps, strategy, "none", None, None),
                                     "predicted not to fit in memory (--run-unfit runs it anyway)"))
            continue
        runtime = runtime_support(strategy)
        if not runtime["deepspeed"]:  # never launch a schedule stock DeepSpeed would run as something else
            left_out.append(_skipped(ctx, _trial(ctx, ps, strategy, "none", None, None),
                                     f"schedule {strategy.schedule!r} not runnable: {runtime['note']}"))
            continue
        if model.family == "llama" and strategy.tp > 1:  # planned for Megatron-style sharding ampe's worker lacks
            left_out.append(_skipped(ctx, _trial(ctx, ps, strategy, "none", None, None),
                                     f"tp={strategy.tp}: ampe's trial worker builds Llama-family layers at tp = 1 "
                                     "(the plan costs Megatron-style sharding; your own script with sharded layers "
                                     "can run it)"))
            continue
        chosen += 1
        if backend != "none" and ps.frequency_plan is not None:
            base = _trial(ctx, ps, strategy, "none", None, None)
            if options.baseline:
                trials.append(base)
            trials.append(_trial(ctx, ps, strategy, backend, ps.frequency_plan, base.key))
        else:
            trials.append(_trial(ctx, ps, strategy, "none", None, None))
    return ctx, trials, left_out


def run_trials(plan: TrialPlan | str | Path, options: TrialOptions,
               view: ProgressView | None = None, stop: StopRequests | None = None) -> list[TrialResult]:
    """Run (or resume) the trials of ``plan``; return one result per planned trial, in predicted order, plus the
    strategies left out as predicted not to fit (status ``skipped``).

    Trials already finished in ``options.out_dir`` are not rerun (their stored results are returned). SIGINT or
    SIGTERM kills the running trial, records it as ``interrupted`` and raises :class:`TrialsInterrupted`; ``stop``:
    the caller's :class:`StopRequests` (already installed), else one is installed for the run."""
    ctx, trials, left_out = prepare(plan, options)
    view = view or SilentView()
    out = Path(options.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "plan.json", resolved_plan(ctx))
    store = ResultsStore(out)
    latest = store.latest()
    estimator = CostEstimator(options.startup_s)
    for r in latest.values():
        estimator.observe(r)

    results: list[TrialResult] = []
    skipped: list[TrialResult] = list(left_out)
    meta = {"plan": str(Path(ctx.plan.source).resolve()), "cluster": ctx.cluster.name, "model": ctx.plan.model,
            "device": ctx.device, "freq_backend": ctx.backend}
    deadline = None if options.budget_s is None else time.monotonic() + options.budget_s
    own_stop = stop is None
    stop = stop if stop is not None else StopRequests()
    try:
        if own_stop:
            stop.__enter__()
        pending = list(trials)
        jit_checked = False
        i = 0
        while pending:
            t = pending.pop(0)
            i += 1
            if stop.requested:
                raise TrialsInterrupted(results)
            old = latest.get(t.key)
            if old is not None and old.finished and not (options.retry_failed and old.status not in ("ok", "oom")):
                results.append(old)
                view.end_trial(old, cached=True)
                continue
            if not jit_checked:  # once, before the first rank starts; a build is not a trial: not on the budget
                jit_checked, t_build = True, time.monotonic()
                if not prebuild_op(ctx, stop):
                    raise TrialsInterrupted(results)
                deadline = None if deadline is None else deadline + time.monotonic() - t_build
            left = None if deadline is None else deadline - time.monotonic()
            expected = estimator.expected_s(t.predicted_s, options.warmup_iters + options.timed_iters)
            if left is not None and expected > left:
                r = _skipped(ctx, t, f"budget: expected {expected:.1f} s, {max(left, 0):.1f} s left")
                skipped.append(r)
                results.append(r)
                view.end_trial(r)
                continue
            view.start_trial(i, len(trials), t.trial_id, _label(t), left)
            timeout = options.timeout_s if left is None else min(options.timeout_s, max(left, 0.0))
            try:
                r = run_one(ctx, t, timeout, view, budget_limited=left is not None and left < options.timeout_s,
                            stop=stop)
            except _StoppedError as stopped:
                r = stopped.result
                store.append(r)
                results.append(r)
                view.end_trial(r)
                raise TrialsInterrupted(results) from None
            if r.status == "skipped":
                skipped.append(r)
            else:
                store.append(r)
                estimator.observe(r)
            results.append(r)
            view.end_trial(r)
            if options.rerank is not None and r.status == "ok" and pending:
                pending, left_behind = _reranked(ctx, options.rerank, results, pending)
                for rest in left_behind:
                    skipped.append(rest)
                    results.append(rest)
                    view.end_trial(rest)
            store.write_summary(skipped, meta)
    except KeyboardInterrupt as e:  # every finished trial is already on disk
        store.write_summary(skipped, meta)
        raise e if isinstance(e, TrialsInterrupted) else TrialsInterrupted(results) from None
    finally:
        if own_stop:
            stop.__exit__()
        view.close()
    store.write_summary(skipped, meta)
    return sorted([*results, *left_out], key=lambda r: (r.plan_rank, r.schedule_applied))


def _reranked(ctx: RunContext, rerank: Callable[..., Rerank], results: list[TrialResult],
              pending: list[PlannedTrial]) -> tuple[list[PlannedTrial], list[TrialResult]]:
    """The pending trials in the reranker's order, and the skipped results when it says stop."""
    decision = rerank(ctx.plan, ctx.cluster, tuple(results), tuple(pending))
    by_key = {t.key: t for t in pending}
    order = [by_key[k] for k in dict.fromkeys(decision.order) if k in by_key]
    order += [t for t in pending if t not in order]  # a reranker that forgets a trial does not lose it
    if decision.stop_reason is None:
        return order, []
    return [], [_skipped(ctx, t, f"adaptive: {decision.stop_reason}") for t in order]


def resolved_plan(ctx: RunContext) -> dict[str, Any]:
    """The plan as written, with the paths it names made absolute (the copy kept in the results folder must still
    find the cluster spec, model and profile; ``cluster_spec`` is the one the trials used)."""
    raw = dict(ctx.plan.raw)
    inputs = dict(raw.get("inputs") or {})
    inputs.update(cluster_spec=str(Path(ctx.cluster.source).resolve()), model=ctx.plan.model,
                  profile=ctx.plan.profile)
    raw["inputs"] = inputs
    return raw


def run_one(ctx: RunContext, t: PlannedTrial, timeout_s: float, view: ProgressView | None = None,
            budget_limited: bool = False, stop: StopRequests | None = None) -> TrialResult:
    """Run one trial to its end (or timeout) and return its result. On SIGINT/SIGTERM (any number, any order) the
    trial's processes are killed and ``_StoppedError`` carries its ``interrupted`` record."""
    if stop is None:
        with StopRequests() as own:
            return run_one(ctx, t, timeout_s, view, budget_limited, own)
    view = view or SilentView()
    job_dir = (Path(ctx.options.out_dir) / "trials" / t.trial_id).resolve()  # other hosts need absolute paths
    shutil.rmtree(job_dir, ignore_errors=True)  # stale outputs of an interrupted attempt must not be read
    job_dir.mkdir(parents=True)
    job_path = job_dir / "job.json"
    write_json_atomic(job_path, job_dict(ctx, t, job_dir))
    try:
        launch = build_launch(ctx, t, str(job_path))
    except UnrealizablePlacementError as e:
        return _skipped(ctx, t, f"placement cannot be launched: {e}")
    cwd = None
    if launch.hostfile is not None:
        write_text_atomic(job_dir / "hostfile", launch.hostfile)
        # DeepSpeed's runner forwards only a few variables over ssh, plus ./.deepspeed_env: start it in the job folder
        # (every host then changes into it, so it must be on a filesystem they share, as the job file already is).
        write_text_atomic(job_dir / ".deepspeed_env", env_file_text(launch.env))
        cwd = str(job_dir)
    write_json_atomic(job_dir / "command.json", {"argv": list(launch.argv), "env": launch.env,
                                                 "rank_env": list(launch.rank_env)})
    if ctx.device == "cpu":  # a rank killed while it held a torch build lock must not make this trial wait
        sweep({**launch_environ(), **launch.env}, say)
    started_at = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    t0 = time.monotonic()
    procs = process.start(launch, job_dir / "launcher.log", cwd=cwd)
    procs.fail_grace_s = ctx.options.fail_grace_s
    timed_out = interrupted = False
    log_tail = None  # the log as it was before the runner signalled anything
    try:
        while not procs.poll():
            elapsed = time.monotonic() - t0
            if stop.requested:
                interrupted = True
                log_tail = _tail(job_dir / "launcher.log")
                procs.kill(ctx.options.kill_grace_s)
                break
            if elapsed > timeout_s:
                timed_out = True
                log_tail = _tail(job_dir / "launcher.log")
                procs.kill(ctx.options.kill_grace_s)
                break
            p = read_progress(job_dir)
            if p is not None:
                view.iteration(p[0], p[1], elapsed)
            stop.wait(ctx.options.poll_s)
    finally:
        if not procs.poll():  # an unexpected error above: never leave the trial's processes behind
            procs.kill(ctx.options.kill_grace_s)
        procs.close()
    wall = time.monotonic() - t0
    if log_tail is None:
        log_tail = _tail(job_dir / "launcher.log")
    outcome = classify(job_dir, procs.returncodes(), log_tail, timed_out=timed_out, interrupted=interrupted,
                       local_ranks=launch.kind == "local", memory_limited=bool(ctx.options.memory_limit_bytes))
    reason = outcome.reason
    if outcome.status == "timeout" and budget_limited:
        reason = f"{reason}; the budget ran out"
    if outcome.status == "timeout" and ctx.device == "cpu":
        # The trial's processes are gone: a torch build lock nobody holds now was left by one of them, or made them
        # wait; either way it is cleared here, so the next trial does not wait on it.
        cleared = sweep({**launch_environ(), **launch.env}, say)
        if cleared:
            reason = (f"{reason}; a JIT build lock no live process held was left, and was cleared: "
                      f"{', '.join(map(str, cleared))}")
    elif outcome.status == "timeout":
        # GPU trials use torch's own folder: a lock still there is stale unless another build runs right now, which
        # the advice leaves to the user to check.
        advice = lock_advice(stale_locks(older_than_s=0.0))
        reason = f"{reason}; {advice}" if advice else reason
    measured = dict(outcome.measured)
    if outcome.status == "ok" and measured.get("energy_j_per_iter") is None:
        measured["energy_j_per_iter"], measured["energy_source"] = modelled_energy(ctx.cluster, t.strategy,
                                                                                 measured["iteration_s_mean"])
    result = TrialResult(
        **_identity(ctx, t), status=outcome.status, reason=reason, failed_rank=outcome.failed_rank,
        wall_s=round(wall, 3), started_at=started_at, job_dir=str(job_dir), **measured)
    if interrupted:
        raise _StoppedError(result)
    return result


def env_file_text(env: Mapping[str, str]) -> str:
    """:func:`~ampe.trials.commands.deepspeed_env_text`, with a variable it cannot hold (a line break in a value,
    say in the user's PYTHONPATH) as one InputError naming it."""
    try:
        return deepspeed_env_text(dict(env))
    except ValueError as e:
        raise InputError(".deepspeed_env", "", str(e)) from None


def say(text: str) -> None:
    """One line from the runner about DeepSpeed's CPU op (a build, a cleared lock) on stderr."""
    sys.stderr.write(f"ampe: {text}\n")
    sys.stderr.flush()


def rank_environment(ctx: RunContext) -> dict[str, str]:
    """The whole environment every rank of this run starts with (as :func:`ampe.trials.process.start` builds it)."""
    return {**launch_environ(), **base_env(ctx.device, dict(ctx.options.env))}


def prebuild_op(ctx: RunContext, stop: StopRequests | None = None) -> bool:
    """Call before any rank of the run starts (:func:`run_trials` does). CPU: DeepSpeed's CPU op built once in the
    ranks' ``TORCH_EXTENSIONS_DIR`` (False when ``stop`` was requested meanwhile); with ``options.prebuild`` off, or
    without DeepSpeed, only dead builders' locks are cleared. GPU: ampe builds nothing; build locks older than 10
    minutes in torch's folder are named. Raises InputError (one line) when the op cannot be built."""
    if ctx.device != "cpu":
        advice = lock_advice(stale_locks())
        if advice:
            say(f"warning: {advice}")
        return True
    env = rank_environment(ctx)
    if not ctx.options.prebuild or not deepspeed_installed():
        sweep(env, say)
        return True
    return prebuild(env, say, stop=None if stop is None else lambda: stop.requested,
                    grace_s=ctx.options.kill_grace_s)


def job_dict(ctx: RunContext, t: PlannedTrial, job_dir: Path) -> dict[str, Any]:
    """The ``ampe.job/1`` file every rank reads (:class:`~ampe.formats.job.JobFile`; see ``docs/trials.md``)."""
    s = t.strategy
    fplan = None
    if t.schedule is not None:
        fplan = t.schedule
        if fplan.gpu_types is None:
            fplan = fplan.model_copy(update={"gpu_types": [ctx.cluster.devices[s.device(j, 0, 0)].gpu.name
                                                           for j in range(s.pp)]})
    job = JobFile.parse({
        "trial_id": t.trial_id, "model": ctx.plan.model, "strategy": _strategy_dict(s),
        "frequency_plan": fplan.to_json() if fplan is not None else None, "freq_backend": t.backend,
        "gpu_types": [d.gpu.name for d in ctx.cluster.devices],
        "device_local_index": [d.local_index for d in ctx.cluster.devices],
        "warmup_iters": ctx.options.warmup_iters, "timed_iters": ctx.options.timed_iters, "seed": ctx.options.seed,
        "dtype": ctx.dtype, "device": ctx.device, "frozen_layers": ctx.plan.frozen_layers,
        "attention": s.attention or ctx.attention, "out_dir": str(job_dir.resolve())}, str(job_dir / "job.json"))
    return job.to_json()


def build_launch(ctx: RunContext, t: PlannedTrial, job_path: str) -> Launch:
    """The command (argv, environment) that starts trial ``t``. Raises UnrealizablePlacementError for a multi-host
    placement the DeepSpeed launcher cannot express."""
    s = t.strategy
    opts = ctx.options
    args = worker_args(worker_ref(opts.worker), job_path, opts.memory_limit_bytes)
    kind = choose_launcher(opts.launcher, ctx.cluster, s.placement)
    env = base_env(ctx.device, dict(opts.env))
    w = s.world_size
    if kind == "torchrun":
        return Launch("torchrun", tuple(torchrun_argv(w, args)), env, w)
    if kind == "local":
        return Launch("local", (sys.executable, *args), env, w, rank_env=local_rank_env(w, free_port()))
    layout = host_layout(ctx.cluster, s.placement or (), opts.host_map)
    hostfile = str(Path(job_path).parent / "hostfile")
    return Launch("deepspeed", tuple(deepspeed_argv(hostfile, layout, free_port(), args)), env, w,
                  hostfile=layout.hostfile_text())


def choose_launcher(kind: str, cluster: Cluster, placement: tuple[int, ...] | None) -> str:
    """``auto``: torchrun when every rank is on one node, else the DeepSpeed launcher. An explicit ``torchrun`` or
    ``local`` runs all ranks on this host even for a multi-node cluster spec (CPU emulation of a cluster)."""
    if kind != "auto":
        return kind
    return "torchrun" if len(nodes_used(cluster, placement or range(cluster.size))) == 1 else "deepspeed"


def trial_backend(requested: str, device: str, plan: TrialPlan) -> str:
    """``auto``: nvml on GPUs, emulate on CPUs — when the plan has frequency schedules at all; else none."""
    if requested != "auto":
        return requested
    if not any(p.frequency_plan is not None for p in plan.strategies):
        return "none"
    return "nvml" if device == "cuda" else "emulate"


def modelled_energy(cluster: Cluster, s: Strategy, iteration_s: float) -> tuple[float, str]:
    """Energy per iteration when the worker had no counter: every device at its TDP for the measured time. An
    upper bound (it ignores pipeline bubbles and lower clocks), labelled as modelled."""
    watts = sum(cluster.devices[d].gpu.tdp_w for d in s.placement or range(cluster.size))
    return watts * iteration_s, "modelled (runner: TDP × measured time, upper bound; no energy counter)"


@dataclass
class CostEstimator:
    """Expected wall time of a trial, refined by the trials measured so far (see the module docstring)."""

    startup_s: float
    startups: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)

    def observe(self, r: TrialResult) -> None:
        """Learn from a finished trial (only measured ones teach anything)."""
        if r.status != "ok" or not r.iteration_s_mean:
            return
        iters = r.warmup_iters + r.timed_iters
        self.startups.append(max(0.0, r.wall_s - iters * r.iteration_s_mean))
        if r.predicted_iteration_s:
            self.ratios.append(r.iteration_s_mean / r.predicted_iteration_s)

    def expected_s(self, predicted_iteration_s: float, iters: int) -> float:
        """Seconds the next trial is expected to take."""
        startup = statistics.median(self.startups) if self.startups else self.startup_s
        ratio = statistics.median(self.ratios) if self.ratios else 1.0
        return startup + iters * predicted_iteration_s * ratio


class _StoppedError(Exception):
    def __init__(self, result: TrialResult) -> None:
        super().__init__(result.trial_id)
        self.result = result


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


def _strategy_dict(s: Strategy) -> dict[str, Any]:
    out = {"pp": s.pp, "dp": s.dp, "tp": s.tp, "mbs": s.mbs, "gbs": s.gbs, "gas": s.gas,
           "partition": list(s.partition or ()), "placement": list(s.placement or ()), "schedule": s.schedule}
    if s.virtual_stages != 1:  # only the interleaved schedule has them
        out["virtual_stages"] = s.virtual_stages
    if s.recompute != "none":  # memory options: only when used, so earlier trial keys stay the same
        out["recompute"] = s.recompute
    if s.stage_recompute is not None:
        out["stage_recompute"] = list(s.stage_recompute)
    if s.zero:
        out["zero"] = s.zero
    if s.attention is not None:  # how it ran: the attention kernel and the precision
        out["attention"] = s.attention
    if s.dtype is not None:
        out["dtype"] = s.dtype
    return out


def _predicted_as_run(ctx: RunContext, ps: PlannedStrategy, s: Strategy) -> PlannedStrategy:
    """``ps`` with its time, memory and fit predicted for how ``s`` runs (another precision or attention kernel than
    the plan entry was costed with), from the plan's cluster and profile (the energy figures and any frequency plan
    stay the entry's). The report makes the same re-prediction (``report.compare``)."""
    from ampe.costmodel.estimate import CostModel

    if "cost_model" not in ctx.cache:
        ctx.cache["cost_model"] = CostModel(ctx.cluster, *ctx.plan.cost_inputs(ctx.cluster))
    est = ctx.cache["cost_model"].estimate(s)
    update = {"iteration_s": est.iteration_s, "max_memory_bytes": est.max_memory_bytes, "fits": est.fits}
    return replace(ps, predicted=ps.predicted.model_copy(update=update))


def _trial(ctx: RunContext, ps: PlannedStrategy, s: Strategy, backend: str, schedule: FrequencyPlan | None,
           baseline_key: str | None) -> PlannedTrial:
    o = ctx.options
    key = trial_key({"model": ctx.plan.model, "cluster": ctx.cluster.name, "strategy": _strategy_dict(s),
                     "backend": backend, "schedule": schedule_key(schedule) if schedule else None,
                     "warmup": o.warmup_iters, "iters": o.timed_iters, "dtype": ctx.dtype, "device": ctx.device,
                     "frozen_layers": ctx.plan.frozen_layers, "seed": o.seed})
    tid = f"r{ps.rank:03d}-pp{s.pp}dp{s.dp}tp{s.tp}-mbs{s.mbs}-{backend}-{key[:8]}"
    predicted = schedule.time_s if schedule is not None and schedule.time_s else ps.predicted.iteration_s
    return PlannedTrial(key, tid, ps, s, backend, schedule, predicted, baseline_key)


def _identity(ctx: RunContext, t: PlannedTrial) -> dict[str, Any]:
    p = t.planned.predicted
    if t.schedule is not None:
        energy = t.schedule.energy_j or p.energy_j
    elif t.planned.frequency_plan is not None:  # the baseline of a scheduled strategy runs at maximum clocks
        energy = p.energy_max_clock_j
    else:
        energy = p.energy_j if p.energy_j is not None else p.energy_max_clock_j
    return dict(key=t.key, trial_id=t.trial_id, plan_rank=t.planned.rank, strategy=_strategy_dict(t.strategy),
                model=ctx.plan.model, cluster=ctx.cluster.name, freq_backend=t.backend,
                schedule_applied=t.schedule is not None, warmup_iters=ctx.options.warmup_iters,
                timed_iters=ctx.options.timed_iters, predicted_iteration_s=t.predicted_s,
                predicted_max_memory_bytes=p.max_memory_bytes, predicted_fits=p.fits, predicted_energy_j=energy,
                baseline_key=t.baseline_key)


def _skipped(ctx: RunContext, t: PlannedTrial, reason: str) -> TrialResult:
    return TrialResult(**_identity(ctx, t), status="skipped", reason=reason)


def _label(t: PlannedTrial) -> str:
    s = t.strategy
    sched = f", {t.backend} schedule" if t.schedule is not None else ""
    return f"rank {t.planned.rank}: pp{s.pp}·dp{s.dp}·tp{s.tp}·mbs{s.mbs}{sched}"


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - LOG_TAIL_BYTES))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


class StopRequests:
    """While trials run, SIGINT and SIGTERM only record that a stop was asked for — any number of them, in any order
    — so no signal can interrupt the runner between killing a trial and writing its record. The runner polls
    :attr:`requested`, kills the running trial, records it as ``interrupted`` and stops. Off the main thread (where
    Python cannot install handlers) it never reports a request."""

    def __init__(self) -> None:
        self.signals: list[int] = []
        self._requested = False
        self._old: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        """True once SIGINT or SIGTERM arrived."""
        return self._requested

    def wait(self, seconds: float) -> None:
        """Sleep ``seconds`` (one poll interval) unless a stop was already requested."""
        if not self._requested:
            time.sleep(seconds)

    def _handler(self, signum: int, frame: object) -> None:
        # No lock here (an Event would take one): the handler runs on the main thread between any two bytecodes,
        # possibly while that thread holds the very lock, and a second signal would deadlock the runner.
        self.signals.append(signum)
        self._requested = True

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        # Once a stop was asked for, the process is on its way out: later signals are ignored rather than turned
        # back into a KeyboardInterrupt that would cut the shutdown (and its exit status) short.
        for sig, old in self._old.items():
            signal.signal(sig, signal.SIG_IGN if self.requested else old)
        self._old.clear()


__all__ = [
    "CostEstimator",
    "PlannedTrial",
    "RunContext",
    "StopRequests",
    "TrialOptions",
    "TrialsInterrupted",
    "build_launch",
    "choose_launcher",
    "job_dict",
    "modelled_energy",
    "prebuild_op",
    "prepare",
    "rank_environment",
    "run_one",
    "run_trials",
    "trial_backend",
]
