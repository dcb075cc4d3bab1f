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
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from ampe.blas import launch_environ
from ampe.costmodel.cluster import Cluster
from ampe.costmodel.strategy import Strategy
from ampe.formats.trial import TrialResult
from ampe.outfolder import OutputFolder
from ampe.trials import lifetime, process
from ampe.trials.buildlock import lock_advice, stale_locks, sweep
from ampe.trials.here import check_here
from ampe.trials.hostfile import UnrealizablePlacementError
from ampe.trials.launch import (
    build_launch,
    env_file_text,
    job_dict,
    prebuild_op,
    say,
)
from ampe.trials.outcome import classify, read_progress
from ampe.trials.planfile import TrialPlan
from ampe.trials.prepare import (
    PlannedTrial,
    Rerank,
    RunContext,
    TrialOptions,
    prepare,
    resolved_plan,
    skipped_result,
    trial_identity,
)
from ampe.trials.progress import ProgressView, SilentView
from ampe.trials.results import SUMMARY_CSV, SUMMARY_JSON, ResultsStore
from ampe.trials.stop import StopRequests

LOG_TAIL_BYTES = 64 * 1024


class TrialsInterrupted(KeyboardInterrupt):
    """SIGINT/SIGTERM stopped the run; ``results`` holds every trial finished before (and the interrupted one)."""

    def __init__(self, results: list[TrialResult]) -> None:
        super().__init__("interrupted")
        self.results = results


def run_trials(plan: TrialPlan | str | Path, options: TrialOptions,
               view: ProgressView | None = None, stop: StopRequests | None = None) -> list[TrialResult]:
    """Run (or resume) the trials of ``plan``; return one result per planned trial, in predicted order, plus the
    strategies left out as predicted not to fit (status ``skipped``).

    Trials already finished in ``options.out_dir`` are not rerun (their stored results are returned). SIGINT or
    SIGTERM kills the running trial, records it as ``interrupted`` and raises :class:`TrialsInterrupted`; ``stop``:
    the caller's :class:`StopRequests` (already installed), else one is installed for the run."""
    ctx, trials, left_out = prepare(plan, options)
    check_here(ctx, trials)  # hosts, GPUs and the frequency backend, before any folder is claimed or rank started
    view = view or SilentView()
    out = OutputFolder(options.out_dir, "--out")  # created; nothing in it is written through a link
    held = lifetime.claim(out)  # one runner per folder; leftovers of dead runners ended before anything is measured
    ctx = replace(ctx, mark=held.mark)
    try:
        out.check_files(["plan.json", SUMMARY_JSON, SUMMARY_CSV])  # a link there: refused before any trial runs
        out.write_json("plan.json", resolved_plan(ctx))
        store = ResultsStore(out.path, out)
        latest = store.latest()
    except BaseException:
        held.release()
        raise
    estimator = CostEstimator(options.startup_s)
    for r in latest.values():
        estimator.observe(r)
    deadline = None if options.budget_s is None else time.monotonic() + options.budget_s
    run = _Run(ctx, options, view, store, estimator, latest, deadline, skipped=list(left_out))
    results, skipped = run.results, run.skipped
    meta = {"plan": str(Path(ctx.plan.source).resolve()), "cluster": ctx.cluster.name, "model": ctx.plan.model,
            "device": ctx.device, "freq_backend": ctx.backend}
    own_stop = stop is None
    stop = stop if stop is not None else StopRequests()
    try:
        if own_stop:
            stop.__enter__()
        pending = list(trials)
        i = 0
        while pending:
            t = pending.pop(0)
            i += 1
            if stop.requested:
                raise TrialsInterrupted(results)
            ran = _trial(run, t, i, len(trials), stop)
            if ran is None:  # its stored result, or skipped for the budget
                continue
            if options.rerank is not None and ran.status == "ok" and pending:
                pending, left_behind = _reranked(ctx, options.rerank, results, pending)
                for rest in left_behind:
                    skipped.append(rest)
                    results.append(rest)
                    view.end_trial(rest)
            store.write_summary(skipped, meta)
        store.write_summary(skipped, meta)
    except KeyboardInterrupt as e:  # every finished trial is already on disk
        store.write_summary(skipped, meta)
        raise e if isinstance(e, TrialsInterrupted) else TrialsInterrupted(results) from None
    finally:
        if own_stop:
            stop.__exit__()
        view.close()
        held.release()  # the folder's last write is done
    return sorted([*results, *left_out], key=lambda r: (r.plan_rank, r.schedule_applied))


@dataclass
class _Run:
    """What one :func:`run_trials` call carries from trial to trial: the results so far (``skipped``: those not
    run), the stored results of earlier runs by trial key, and the budget's deadline (monotonic s; None: none)."""

    ctx: RunContext
    options: TrialOptions
    view: ProgressView
    store: ResultsStore
    estimator: CostEstimator
    latest: dict[str, TrialResult]
    deadline: float | None
    results: list[TrialResult] = field(default_factory=list)
    skipped: list[TrialResult] = field(default_factory=list)
    jit_checked: bool = False


def _trial(run: _Run, t: PlannedTrial, i: int, n: int, stop: StopRequests) -> TrialResult | None:
    """Trial ``t`` (the ``i``-th of ``n``) recorded: its stored result when it finished before, skipped when the
    budget left cannot pay for it, else run. Returns the result of a run (None otherwise); on a stop request the
    interrupted trial is stored and :class:`TrialsInterrupted` raised."""
    options = run.options
    old = run.latest.get(t.key)
    if old is not None and old.finished and not (options.retry_failed and old.status not in ("ok", "oom")):
        run.results.append(old)
        run.view.end_trial(old, cached=True)
        return None
    if not run.jit_checked:  # once, before the first rank starts; a build is not a trial: not on the budget
        run.jit_checked, t_build = True, time.monotonic()
        if not prebuild_op(run.ctx, stop):
            raise TrialsInterrupted(run.results)
        run.deadline = None if run.deadline is None else run.deadline + time.monotonic() - t_build
    left = None if run.deadline is None else run.deadline - time.monotonic()
    expected = run.estimator.expected_s(t.predicted_s, options.warmup_iters + options.timed_iters)
    if left is not None and expected > left:
        r = skipped_result(run.ctx, t, f"budget: expected {expected:.1f} s, {max(left, 0):.1f} s left")
        run.skipped.append(r)
        run.results.append(r)
        run.view.end_trial(r)
        return None
    run.view.start_trial(i, n, t.trial_id, _label(t), left)
    timeout = options.timeout_s if left is None else min(options.timeout_s, max(left, 0.0))
    try:
        r = run_one(run.ctx, t, timeout, run.view, budget_limited=left is not None and left < options.timeout_s,
                    stop=stop)
    except _StoppedError as stopped:
        r = stopped.result
        run.store.append(r)
        run.results.append(r)
        run.view.end_trial(r)
        raise TrialsInterrupted(run.results) from None
    if r.status == "skipped":
        run.skipped.append(r)
    else:
        run.store.append(r)
        run.estimator.observe(r)
    run.results.append(r)
    run.view.end_trial(r)
    return r


def _reranked(ctx: RunContext, rerank: Callable[..., Rerank], results: list[TrialResult],
              pending: list[PlannedTrial]) -> tuple[list[PlannedTrial], list[TrialResult]]:
    """The pending trials in the reranker's order, and the skipped results when it says stop."""
    decision = rerank(ctx.plan, ctx.cluster, tuple(results), tuple(pending))
    by_key = {t.key: t for t in pending}
    order = [by_key[k] for k in dict.fromkeys(decision.order) if k in by_key]
    order += [t for t in pending if t not in order]  # a reranker that forgets a trial does not lose it
    if decision.stop_reason is None:
        return order, []
    return [], [skipped_result(ctx, t, f"adaptive: {decision.stop_reason}") for t in order]


def run_one(ctx: RunContext, t: PlannedTrial, timeout_s: float, view: ProgressView | None = None,
            budget_limited: bool = False, stop: StopRequests | None = None) -> TrialResult:
    """Run one trial to its end (or timeout) and return its result. On SIGINT/SIGTERM (any number, any order) the
    trial's processes are killed and ``_StoppedError`` carries its ``interrupted`` record."""
    if stop is None:
        with StopRequests() as own:
            return run_one(ctx, t, timeout_s, view, budget_limited, own)
    view = view or SilentView()
    # stale outputs of an interrupted attempt must not be read: the job folder starts empty, and nothing in it or on
    # the way to it is followed if it is a link (ampe.outfolder); its path is absolute: other hosts need that
    with OutputFolder(ctx.options.out_dir, "--out") as results:
        job = results.fresh(f"trials/{t.trial_id}")
    job_dir = job.path
    job_path = job.write_json("job.json", job_dict(ctx, t, job_dir))
    try:
        launch = build_launch(ctx, t, str(job_path))
    except UnrealizablePlacementError as e:
        job.close()
        return skipped_result(ctx, t, f"placement cannot be launched: {e}")
    cwd = None
    if launch.hostfile is not None:
        job.write_text("hostfile", launch.hostfile)
        # DeepSpeed's runner forwards only a few variables over ssh, plus ./.deepspeed_env: start it in the job folder
        # (every host then changes into it, so it must be on a filesystem they share, as the job file already is).
        job.write_text(".deepspeed_env", env_file_text(launch.env))
        cwd = str(job_dir)
    job.write_json("command.json", {"argv": list(launch.argv), "env": launch.env, "rank_env": list(launch.rank_env)})
    job.close()
    if ctx.device == "cpu":  # a rank killed while it held a torch build lock must not make this trial wait
        sweep({**launch_environ(), **launch.env}, say, ctx.options.quiet_s)
    started_at = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    t0 = time.monotonic()
    procs = process.start(launch, job_dir / "launcher.log", cwd=cwd, mark=ctx.mark)
    procs.fail_grace_s = ctx.options.fail_grace_s
    timed_out, interrupted, log_tail = _watch(procs, job_dir, t0, timeout_s, ctx.options, view, stop)
    wall = time.monotonic() - t0
    if log_tail is None:
        log_tail = _tail(job_dir / "launcher.log")
    outcome = classify(job_dir, procs.returncodes(), log_tail, timed_out=timed_out, interrupted=interrupted,
                       local_ranks=launch.kind == "local", memory_limited=bool(ctx.options.memory_limit_bytes))
    reason = outcome.reason
    if outcome.status == "timeout":
        reason = _timeout_reason(ctx, launch.env, reason, budget_limited)
    measured = dict(outcome.measured)
    if outcome.status == "ok" and measured.get("energy_j_per_iter") is None:
        measured["energy_j_per_iter"], measured["energy_source"] = modelled_energy(ctx.cluster, t.strategy,
                                                                                 measured["iteration_s_mean"])
    result = TrialResult(
        **trial_identity(ctx, t), status=outcome.status, reason=reason, failed_rank=outcome.failed_rank,
        wall_s=round(wall, 3), started_at=started_at, job_dir=str(job_dir), **measured)
    if interrupted:
        raise _StoppedError(result)
    return result


def _watch(procs: process.TrialProcesses, job_dir: Path, t0: float, timeout_s: float, options: TrialOptions,
           view: ProgressView, stop: StopRequests) -> tuple[bool, bool, str | None]:
    """Poll a trial started at ``t0`` (monotonic s) to its end, showing its progress; its processes are killed on a
    stop request or ``timeout_s`` (s) after ``t0``. Returns (timed out, interrupted, the log's tail as it was before
    the runner signalled anything, None when it did not)."""
    timed_out = interrupted = False
    log_tail = None
    try:
        while not procs.poll():
            elapsed = time.monotonic() - t0
            if stop.requested:
                interrupted = True
                log_tail = _tail(job_dir / "launcher.log")
                procs.kill(options.kill_grace_s)
                break
            if elapsed > timeout_s:
                timed_out = True
                log_tail = _tail(job_dir / "launcher.log")
                procs.kill(options.kill_grace_s)
                break
            p = read_progress(job_dir)
            if p is not None:
                view.iteration(p[0], p[1], elapsed)
            stop.wait(options.poll_s)
    finally:
        if not procs.poll():  # an unexpected error above: never leave the trial's processes behind
            procs.kill(options.kill_grace_s)
        procs.close()
    return timed_out, interrupted, log_tail


def _timeout_reason(ctx: RunContext, launch_env: dict[str, str], reason: str | None,
                    budget_limited: bool) -> str | None:
    """A timed-out trial's reason with what the runner knows beyond the outcome: the budget ran out, a JIT build
    lock was left (CPU: cleared here; GPU: the advice)."""
    if budget_limited:
        reason = f"{reason}; the budget ran out"
    if ctx.device == "cpu":
        # The trial's processes are gone: a torch build lock nobody holds now was left by one of them, or made them
        # wait; either way it is cleared here, so the next trial does not wait on it.
        cleared = sweep({**launch_environ(), **launch_env}, say, ctx.options.quiet_s)
        if cleared:
            reason = (f"{reason}; a JIT build lock no live process held was left, and was cleared: "
                      f"{', '.join(map(str, cleared))}")
        return reason
    # GPU trials use torch's own folder: a lock still there is stale unless another build runs right now, which
    # the advice leaves to the user to check.
    advice = lock_advice(stale_locks(older_than_s=0.0))
    return f"{reason}; {advice}" if advice else reason


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


# TrialOptions is defined in ampe.trials.prepare; it stays importable from here because docs/trials.md documents
# ``from ampe.trials.runner import TrialOptions, TrialsInterrupted, run_trials`` as the Python API.
__all__ = ["CostEstimator", "TrialOptions", "TrialsInterrupted", "modelled_energy", "run_one", "run_trials"]
