"""How one trial starts: its job file, the launch command and environment of its ranks, and DeepSpeed's CPU op
built before the first rank of a run (:mod:`ampe.trials.buildlock`)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ampe.blas import launch_environ
from ampe.costmodel.catalog import emulated_slowdowns
from ampe.costmodel.cluster import Cluster
from ampe.errors import InputError
from ampe.formats.job import JobFile
from ampe.jitops import deepspeed_installed
from ampe.trials.buildlock import lock_advice, prebuild, stale_locks, sweep
from ampe.trials.commands import (
    Launch,
    base_env,
    deepspeed_argv,
    deepspeed_env_text,
    free_port,
    local_rank_env,
    torchrun_argv,
    worker_args,
)
from ampe.trials.hostfile import host_layout, nodes_used
from ampe.trials.prepare import PlannedTrial, RunContext
from ampe.trials.stop import StopRequests
from ampe.trials.worker_ref import worker_ref


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
        sweep(env, say, ctx.options.quiet_s)
        return True
    return prebuild(env, say, stop=None if stop is None else lambda: stop.requested,
                    grace_s=ctx.options.kill_grace_s, quiet_s=ctx.options.quiet_s)


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
        "trial_id": t.trial_id, "model": ctx.plan.model, "strategy": s.to_dict(),
        "frequency_plan": fplan.to_json() if fplan is not None else None, "freq_backend": t.backend,
        "gpu_types": [d.gpu.name for d in ctx.cluster.devices],
        "device_local_index": [d.local_index for d in ctx.cluster.devices],
        "warmup_iters": ctx.options.warmup_iters, "timed_iters": ctx.options.timed_iters, "seed": ctx.options.seed,
        "dtype": ctx.dtype, "device": ctx.device, "frozen_layers": ctx.plan.frozen_layers,
        "attention": s.attention or ctx.attention, "tf32": s.tf32, "out_dir": str(job_dir.resolve()),
        "speed_ratio": speed_ratios(ctx),
        **({"seq_len": ctx.plan.seq_len} if ctx.plan.seq_len else {})}, str(job_dir / "job.json"))
    return job.to_json()


def speed_ratios(ctx: RunContext) -> list[float] | None:
    """Per device id, the factor its ranks stretch their computations by when ``emulate_speed`` is asked for on a
    CPU run (:func:`~ampe.costmodel.catalog.emulated_slowdowns` of the devices' types at the run's precision, the
    one the trial's prediction is costed at); None otherwise."""
    if not ctx.options.emulate_speed or ctx.device != "cpu":
        return None
    return list(emulated_slowdowns([d.gpu for d in ctx.cluster.devices], ctx.dtype))


def build_launch(ctx: RunContext, t: PlannedTrial, job_path: str) -> Launch:
    """The command (argv, environment) that starts trial ``t``. Raises UnrealizablePlacementError for a multi-host
    placement the DeepSpeed launcher cannot express."""
    s = t.strategy
    opts = ctx.options
    args = worker_args(worker_ref(opts.worker), job_path, opts.memory_limit_bytes)
    kind = choose_launcher(opts.launcher, ctx.cluster, s.placement)
    env = base_env(ctx.device, dict(opts.env), s.expandable_segments)
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
