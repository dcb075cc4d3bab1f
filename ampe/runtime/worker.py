"""One rank of a real trial: ``torchrun --nproc_per_node W -m ampe.runtime.worker JOB_DIR/job.json``.

Reads the job (contract in ``docs/trials.md``), refuses a strategy it cannot run
(:func:`ampe.costmodel.runnable.runtime_problems`), builds the GPT or Llama-family model as a stock DeepSpeed
``PipelineModule`` (ampe's tensor-parallel layers, the vocab-parallel loss) with the strategy's exact partition,
pp/dp/tp topology and placement, runs warm-up then timed ``engine.train_batch``
iterations under the frequency-schedule hook, and writes ``rank{R}.json`` (every rank), ``result.json`` (rank 0,
after gathering every rank's figures) and ``progress.json`` (rank 0, each iteration). Failures write
``error_rank{R}.json`` with kind ``oom`` or ``crash`` and exit non-zero. Design notes: ``docs/worker.md``.

Measurements per rank:
* iteration time: wall time of ``engine.train_batch`` (CUDA: synchronised), per timed iteration;
* peak memory: CUDA ``max_memory_allocated``; CPU the peak of live torch tensor bytes over one traced warm-up
  iteration (:class:`~ampe.measure.memory_probe.CpuAllocationTrace`), with the RSS high-water delta as a cross-check;
  beside it the reserved and device-used peaks and the allocator settings that ran
  (:func:`~ampe.measure.memory_probe.footprint_peaks`; the rank starts with ``PYTORCH_CUDA_ALLOC_CONF`` as the
  strategy's ``expandable_segments`` says);
* energy: NVML's cumulative counter where present, else modelled from the DVFS power model and busy/idle time
  (:class:`~ampe.measure.freq.ModelledEnergy`), labelled "modelled".
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from ampe.costmodel.training import (
    ALLOC_CONF,
    allocator_conf,
    expandable_in_conf,
    optimizer_label,
    replica_deepspeed_config,
)
from ampe.formats.job import JobFile
from ampe.formats.worker import RankReport, WorkerResult
from ampe.io import write_json_atomic
from ampe.runnermark import watch_runner
from ampe.runtime.aggregate import aggregate
from ampe.runtime.freeze import FrozenCuts, freeze_prefix, placeholder_parameter
from ampe.runtime.freeze import install as install_frozen
from ampe.runtime.placement import visible_gpu_index
from ampe.runtime.replicas import ReduceMarks, ShareSwitch, WeightedLoss, replica_batches, weighted


def parse_job(raw: Any, job_path: Path) -> JobFile:
    """Validate a job (:class:`~ampe.formats.job.JobFile`, the model the runner writes it with); the output folder
    defaults to the job file's. Raises InputError naming the file and the field."""
    job = JobFile.parse(raw, str(job_path))
    return job if job.out_dir else job.model_copy(update={"out_dir": str(job_path.parent)})


@dataclass(frozen=True)
class Coordinates:
    """Where this rank sits: (stage, replica, shard) and the device it runs on."""

    rank: int
    world: int
    stage: int
    replica: int
    shard: int
    device: int


def coordinates(strategy: Any, rank: int) -> Coordinates:
    """(stage, replica, shard) of ``rank`` in ampe's order rank = stage·dp·tp + replica·tp + shard, and its device
    ``placement[rank]``."""
    stage, rest = divmod(rank, strategy.dp * strategy.tp)
    replica, shard = divmod(rest, strategy.tp)
    assert strategy.rank(stage, replica, shard) == rank
    return Coordinates(rank, strategy.world_size, stage, replica, shard, strategy.placement[rank])


def pin_cpu(device: int) -> int:
    """Pin this process to core ``device mod (cores available)``; returns the core."""
    cores = sorted(os.sched_getaffinity(0))
    core = cores[device % len(cores)]
    os.sched_setaffinity(0, {core})
    return core


def classify_error(exc: BaseException) -> str:
    """``oom`` for out-of-memory errors (CUDA OOM, MemoryError, RuntimeError mentioning memory), else ``crash``."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return "oom"
    msg = str(exc).lower()
    if isinstance(exc, RuntimeError) and ("out of memory" in msg or "can't allocate memory" in msg
                                          or "cannot allocate memory" in msg):
        return "oom"
    return "crash"


def tied_digests(pipe: Any) -> dict[str, str]:
    """SHA-1 of each tied weight this stage holds (equal digests across stages = the copies stayed identical)."""
    import hashlib

    out = {}
    for key, module in pipe.tied_modules.items():
        for attr in pipe.tied_weight_attrs[key]:
            w = pipe._recursive_getattr(module, attr).detach().float().cpu().contiguous()
            out[f"{key}.{attr}"] = hashlib.sha1(w.numpy().tobytes()).hexdigest()
    return out


def save_parameters(pipe: Any, path: Path, gradients: dict[str, Any] | None = None) -> int:
    """Write this rank's parameters (``torch.save``: name → {"tensor", "shard", "grad"}, the shard's place in the
    tp = 1 tensor as :class:`~ampe.runtime.tensor_parallel.Shard` fields, None where replicated; ``grad`` the last
    step's reduced gradient from ``gradients``, None where absent); returns how many."""
    import dataclasses

    import torch

    from ampe.runtime.tensor_parallel import SHARD_ATTR

    out = {}
    for name, p in pipe.named_parameters():
        shard = getattr(p, SHARD_ATTR, None)
        out[name] = {"tensor": p.detach().float().cpu().clone(),
                     "shard": None if shard is None else dataclasses.asdict(shard),
                     "grad": (gradients or {}).get(name)}
    torch.save(out, path)
    return len(out)


@dataclass
class Timed:
    """What the timed iterations measured on this rank."""

    iteration_s: list[float]
    warmup_s: list[float]
    compute_s: list[float]
    stretch_s: list[float]
    energy_j: list[float]
    losses: list[float]
    own_s: list[float | None]  # until this rank began the gradient reduction, per timed iteration (ReduceMarks)
    cpu_s: list[float]  # this process's CPU seconds per timed iteration (all threads)
    machine_busy_s: list[float | None]  # machine-wide busy CPU seconds per timed iteration (rank 0 only; /proc/stat)
    scheduled: list[bool] = field(default_factory=list)  # per timed iteration: the plan was applied
    # the training thread's run-queue wait per timed iteration: its core ran other work (host_load; None off Linux)
    waited_s: list[float | None] = field(default_factory=list)
    compute_waited_s: list[float | None] = field(default_factory=list)  # the part of it within computations


class Trial:
    """Everything one rank does, in order: place, build, train under the hook, report."""

    def __init__(self, job: JobFile, rank: int, world: int, t_start: float) -> None:
        self.job, self.rank, self.world, self.t_start = job, rank, world, t_start

    def run(self) -> dict[str, Any]:
        """Run the trial on this rank; returns the rank report (``rank{R}.json``)."""
        self._resolve()
        placement = self._place()
        import torch

        from ampe.runtime.precision import apply_tf32

        self.torch = torch
        tf32 = apply_tf32(torch, self.job.tf32)  # before the model is built: every product runs as the plan says
        engine, freeze = self._build_engine()
        hook, controller, energy, meter, backend = self._frequency(torch)
        hook.install(engine)
        self.marks = ReduceMarks(keep_gradients=self.job.save_parameters)
        self.marks.install(engine)  # after the hook: it times the reduction the hook leaves alone
        t_ready = time.perf_counter()
        with controller:  # closed (clocks reset) on the way out, whatever happens
            trace, timed = self._train(engine, hook, energy, meter)
            controller_stats = controller.stats()
        where, partition = self.where, self.partition
        from ampe.runtime.attention import kernel_ran  # torch: only after pinning

        if self.job.save_parameters:
            save_parameters(engine.module, Path(self.job.out_dir or ".") / f"parameters_rank{self.rank}.pt",
                            self.marks.gradients)

        return {
            "rank": self.rank, "stage": where.stage, "replica": where.replica, "shard": where.shard,
            "device": where.device, "gpu_type": self.gpu.name, "placement": placement, "host": socket.gethostname(),
            "layers": [partition[where.stage], partition[where.stage + 1]],
            "iteration_s": timed.iteration_s,
            # the replica's share and this rank's own time: until it reached the gradient reduction, before waiting
            # for slower replicas there
            "share": self.strategy.shares[where.replica], "own_s": timed.own_s,
            "warmup_iteration_s": timed.warmup_s,
            "compute_s_per_iter": timed.compute_s,
            "cpu_s_per_iter": timed.cpu_s,
            # run-queue wait of the training thread (its core ran other processes), over the iteration and within
            # its computations (what an emulated slow rank stretches along with the computation)
            "waited_s_per_iter": timed.waited_s, "compute_waited_s_per_iter": timed.compute_waited_s,
            "machine_busy_s_per_iter": timed.machine_busy_s if self.rank == 0 else None,
            "loss": timed.losses,
            **self._memory(trace, engine),
            "energy_j": (sum(timed.energy_j) / len(timed.energy_j)) if timed.energy_j else None,
            "energy_source": "nvml" if meter is not None else ("modelled" if energy is not None else None),
            "freq_backend": backend,
            "plan_steps": len(hook.plan) if hook.plan is not None else None,
            "energy_j_per_iter": timed.energy_j,
            "scheduled_per_iter": timed.scheduled if self.job.alternate_schedule else None,
            "shares_per_iter": ([list(self.switch.vectors[i % 2]) for i in range(len(timed.iteration_s))]
                                if self.switch is not None else None),
            "plan_applied": (hook.plan is not None and hook.ok and backend in ("emulate", "nvml")
                             and not (controller_stats or {}).get("errors")),
            "instructions_ok": hook.ok,
            "instruction_mismatch": hook.mismatch,
            "emulated": ({"stretch_s": sum(timed.stretch_s) / len(timed.stretch_s),
                          "stretch_s_per_iter": timed.stretch_s, "method": (controller_stats or {}).get("method")}
                         if backend == "emulate" or self.slowdown != 1.0 else None),
            "speed_ratio": self.slowdown,
            "controller": controller_stats if backend == "nvml" else None,
            "startup_s": t_ready - self.t_start,
            "tied_weight_sha1": tied_digests(engine.module),
            # what ran, for the record: the attention the plan named and the kernel torch chose, the optimizer
            "attention": self.model.attention, "attention_kernel": kernel_ran(), "optimizer": self.optimizer,
            "dtype": self.job.dtype, "tf32": tf32,
            **freeze,
        }

    def _resolve(self) -> None:
        """Model, validated strategy, this rank's coordinates and GPU type."""
        from ampe.costmodel.catalog import CATALOG
        from ampe.costmodel.runnable import runtime_problems
        from ampe.costmodel.strategy import strategy_from_dict, validate
        from ampe.costmodel.zoo import load_model

        job = self.job
        strategy = strategy_from_dict(job.strategy, "job.strategy")
        # the model as the plan costed it: its attention kernel, in the job's precision
        model = load_model(job.model, job.attention or strategy.attention, job.dtype, job.seq_len)
        if strategy.dtype not in (None, job.dtype):
            raise ValueError(f"job.strategy.dtype {strategy.dtype!r} disagrees with job.dtype {job.dtype!r}")
        if strategy.tf32 not in (None, job.tf32):
            raise ValueError(f"job.strategy.tf32 {strategy.tf32!r} disagrees with job.tf32 {job.tf32!r}")
        strategy = validate(strategy, self.world, model.num_layers, "job.strategy")
        problems = runtime_problems(strategy, model)
        if problems:
            raise ValueError(f"job.strategy: the worker cannot run it: {'; '.join(problems)}")
        if job.frozen_layers > model.num_layers:
            raise ValueError(f"frozen_layers {job.frozen_layers} > {model.num_layers} layers")
        where = coordinates(strategy, self.rank)
        gpu_name = job.gpu_types[where.device] if where.device < len(job.gpu_types) else job.device
        # emulated mixed speeds: a type of the spec's own (not in the catalog) is modelled as the core it runs on
        self.slowdown = job.speed_ratio[where.device] if job.speed_ratio is not None else 1.0
        if job.device == "cpu" and gpu_name not in CATALOG:
            gpu_name = "cpu"
        if gpu_name not in CATALOG:
            raise ValueError(f"job.gpu_types[{where.device}]: unknown GPU type {gpu_name!r}")
        assert strategy.partition is not None  # validate() completes the strategy
        self.partition: tuple[int, ...] = strategy.partition
        self.model, self.strategy, self.where, self.gpu = model, strategy, where, CATALOG[gpu_name]

    def _place(self) -> dict[str, Any]:
        """Pin to the placement's core (CPU, before torch starts thread pools) or select its GPU; init the
        process group; take the RSS baseline."""
        job, where = self.job, self.where
        placement: dict[str, Any] = {}
        if job.device == "cpu":
            placement["core"] = pin_cpu(where.device)
        # the allocator as the plan says, before CUDA initialises (the runner's environment says so already; a rank
        # started another way gets it here)
        conf = allocator_conf(self.strategy.expandable_segments, os.environ.get(ALLOC_CONF))
        if conf is not None:
            os.environ[ALLOC_CONF] = conf
        import deepspeed
        import torch

        if job.device == "cpu":
            torch.set_num_threads(1)
            # DeepSpeed's CPU op through ampe's build lock (normally prebuilt: a check of under a second), so that
            # init_distributed finds it loaded and never waits on a torch build lock whose builder is gone
            from ampe.runtime.prebuild import ensure_op

            ensure_op()
        else:
            local = job.device_local_index[where.device] if job.device_local_index is not None else None
            gpu_index = (visible_gpu_index(local) if local is not None
                         else where.device % torch.cuda.device_count())
            placement["gpu_index"] = gpu_index
            os.environ["LOCAL_RANK"] = str(gpu_index)  # DeepSpeed places the engine and module on cuda:LOCAL_RANK
            torch.cuda.set_device(gpu_index)
        deepspeed.init_distributed(dist_backend="gloo" if job.device == "cpu" else "nccl")
        from ampe.measure import memory_probe

        self.rss_base = memory_probe.rss_bytes()
        memory_probe.reset_rss_peak()
        return placement

    def _build_engine(self) -> tuple[Any, dict[str, Any]]:
        """The DeepSpeed pipeline engine over the explicit partition and pp/dp/tp topology; frozen prefix applied."""
        import deepspeed
        from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

        import ampe.runtime.pipeline as pipeline
        from ampe.runtime.tensor_parallel import VocabParallelLoss, mark_grad_norm_owners, new_tp_groups

        torch, job, strategy, where = self.torch, self.job, self.strategy, self.where
        tp = new_tp_groups(strategy.pp, strategy.dp, strategy.tp)
        assert strategy.rank(where.stage, where.replica, tp.rank) == self.rank
        topo = PipeModelDataParallelTopology(num_pp=strategy.pp, num_mp=strategy.tp, num_dp=strategy.dp)
        c = topo.get_coord(self.rank)
        if (c.pipe, c.data, c.model) != (where.stage, where.replica, where.shard):
            raise RuntimeError(f"DeepSpeed topology puts rank {self.rank} at {c}, ampe at {where}")
        torch.manual_seed(job.seed)  # identical everywhere: tp shards slice the same master weights
        # each rank builds only its own stage, so recomputation is per stage: this rank's stage decides whether its
        # PipelineModule checkpoints its blocks (DeepSpeed reads activation_checkpoint_interval locally)
        own = strategy.recompute_at(where.stage)
        # the last stage's output is this rank's slice of the logits: the loss is vocab-parallel
        pipe = pipeline.explicit_pipeline_module(pipeline.model_specs(self.model, tp, job.dropout),
                                                 list(self.partition), topo,
                                                 loss_fn=self._loss(VocabParallelLoss(tp)),
                                                 partition_method="explicit", **pipeline.recompute_kwargs(own),
                                                 **pipeline.seed_kwargs(job.seed))
        if (pipe._local_start, pipe._local_stop) != tuple(self.partition[where.stage:where.stage + 2]):
            raise RuntimeError("DeepSpeed did not honour the explicit partition")
        if own == "selective":  # each block of this stage re-runs its core attention in backward
            pipeline.set_selective(pipe)
        mark_grad_norm_owners(pipe, tp)  # gradient clipping's norm counts each parameter once
        freeze: dict[str, Any] = dict(freeze_prefix(pipe, job.frozen_layers, self.model))
        params = [p for p in pipe.parameters() if p.requires_grad]
        if not params:  # an all-frozen stage: stock DeepSpeed refuses an empty optimizer
            params = [placeholder_parameter(pipe)]
            freeze["placeholder_parameter"] = True
        # The plan's own DeepSpeed config (ampe.costmodel.training): the optimizer the export and the memory model
        # name, built by DeepSpeed from the config (torch's fused AdamW: no JIT-built op)
        config = replica_deepspeed_config(strategy, where.replica, job.dtype)  # the replica's own gas (its share)
        engine, _, _, _ = deepspeed.initialize(model=pipe, model_parameters=params, config=config)
        self.optimizer = pipeline.optimizer_in_use(engine)
        if self.optimizer != optimizer_label(config):
            raise RuntimeError(f"DeepSpeed built {self.optimizer}; the plan's config asks for "
                               f"{optimizer_label(config)}")
        if job.frozen_layers:
            cuts = FrozenCuts.of(self.partition, where.stage, job.frozen_layers)
            freeze["frozen_instructions"] = install_frozen(engine, cuts)
        return engine, freeze

    def _loss(self, loss_fn: Any) -> Any:
        """The replica's weighted loss; with ``alternate_shares`` a :class:`ShareSwitch` over both vectors."""
        job, s, r = self.job, self.strategy, self.where.replica
        if job.alternate_shares is None:
            self.switch = None
            return weighted(loss_fn, s.shares, r)
        if len(job.alternate_shares) != s.dp:
            raise ValueError(f"job.alternate_shares: needs one share per replica ({s.dp})")
        data = partial(replica_batches, self.model.vocab, self.model.seq_len, s.mbs, job.seed)
        self.switch = ShareSwitch(WeightedLoss(loss_fn, 1.0), s.mbs, r, s.shares, job.alternate_shares,
                                  lambda shares: data(shares, r))
        return self.switch.loss

    def _train(self, engine: Any, hook: Any, energy: Any, meter: Any) -> tuple[Any, Timed]:
        """Warm-up iterations (the last one memory-traced on CPU), a barrier, then the timed iterations."""
        import torch.distributed as dist

        from ampe.measure import host_load, memory_probe

        job = self.job
        data = replica_batches(self.model.vocab, self.model.seq_len, self.strategy.mbs, job.seed,
                               self.strategy.shares, self.where.replica)
        switch = self.switch  # A/B shares: warm-up and timed iterations alternate, the strategy's first

        def feed(i: int) -> Any:
            return data if switch is None else switch.use(engine, i)
        sync = self.torch.cuda.synchronize if job.device == "cuda" else (lambda: None)
        total = job.warmup_iters + job.timed_iters
        timed = Timed([], [], [], [], [], [], [], [], [])
        trace = None
        for i in range(job.warmup_iters):
            # The last warm-up iteration is traced on CPU: optimizer states exist by then, and the timed
            # iterations stay free of the profiler's overhead.
            t0 = time.perf_counter()
            if job.device == "cpu" and i == job.warmup_iters - 1:
                trace = memory_probe.CpuAllocationTrace()
                with trace:
                    loss = engine.train_batch(data_iter=feed(i))
            else:
                loss = engine.train_batch(data_iter=feed(i))
            sync()
            timed.warmup_s.append(time.perf_counter() - t0)
            hook.end_iteration()
            timed.losses.append(float(loss))
            if energy is not None:
                energy.finish_iteration(0.0)  # discard warm-up energy
            self._progress(i + 1, total, "warmup")
        dist.barrier()
        for i in range(job.timed_iters):
            if job.alternate_schedule:  # interleaved A/B: odd iterations with the plan, even ones without
                hook.set_enabled(i % 2 == 1)
            timed.scheduled.append(hook.plan is not None and hook.active and hook.enabled)
            e0 = meter.read_j() if meter is not None else None
            h0 = host_load.LoadSample.now()
            t0 = time.perf_counter()
            loss = engine.train_batch(data_iter=feed(i))
            sync()
            dt = time.perf_counter() - t0
            h1 = host_load.LoadSample.now()
            timed.cpu_s.append(h1.own_cpu_s - h0.own_cpu_s)
            timed.waited_s.append(None if h0.waited_s is None or h1.waited_s is None else h1.waited_s - h0.waited_s)
            timed.machine_busy_s.append(None if h0.machine_busy_s is None or h1.machine_busy_s is None
                                        else h1.machine_busy_s - h0.machine_busy_s)
            records = hook.end_iteration()
            timed.iteration_s.append(dt)
            timed.own_s.append(self.marks.own_s(t0))
            timed.losses.append(float(loss))
            timed.compute_s.append(sum(r.seconds for r in records))
            timed.stretch_s.append(sum(r.stretch_s for r in records))
            waits = [r.waited_s for r in records]
            timed.compute_waited_s.append(None if None in waits else sum(w for w in waits if w is not None))
            if meter is not None:
                timed.energy_j.append(meter.read_j() - e0)
            elif energy is not None:
                timed.energy_j.append(energy.finish_iteration(dt))
            self._progress(job.warmup_iters + i + 1, total, "timed")
        return trace, timed

    def _frequency(self, torch: Any) -> tuple[Any, Any, Any, Any, str]:
        """The hook, controller, modelled-energy account (or None), NVML energy meter (or None) and backend."""
        from ampe.runtime.frequency import frequency_run, stage_steps

        job, where = self.job, self.where
        plan = None
        if job.frequency_plan is not None:
            why = job.frequency_plan.check_shape(self.strategy.pp, self.strategy.dp)
            if why:
                raise ValueError(f"job.frequency_plan.{why}")
            plan = stage_steps(job.frequency_plan, where.stage, where.replica)
        run = frequency_run(plan, job.freq_backend, job.device, self.gpu, where.stage, torch, self.slowdown)
        return run.hook, run.controller, run.energy, run.meter, run.backend

    def _memory(self, trace: Any, engine: Any) -> dict[str, Any]:
        """Peak memory (see the module docstring) and a breakdown: weights, grads, Adam states, RSS delta."""
        from ampe.measure import memory_probe

        torch = self.torch
        params = list(engine.module.parameters())
        inner = getattr(engine.optimizer, "optimizer", engine.optimizer)  # DeepSpeed's bf16/fp16 wrappers
        states = [v for st in getattr(inner, "state", {}).values() for v in st.values()
                  if torch.is_tensor(v) and v.dim() > 0]
        breakdown = {
            "weights": memory_probe.tensors_bytes(params),
            "grads": memory_probe.tensors_bytes(p.grad for p in params if p.grad is not None),
            "optimizer_states": memory_probe.tensors_bytes(states),
        }
        rss_peak = memory_probe.rss_peak_bytes()
        if self.rss_base is not None and rss_peak is not None:
            breakdown["rss_peak_delta"] = rss_peak - self.rss_base
        peaks = memory_probe.footprint_peaks(self.job.device, os.environ.get(ALLOC_CONF))
        peaks["expandable_segments"] = expandable_in_conf(peaks["allocator_settings"])  # what ran
        if self.job.device == "cuda":
            return {"peak_memory_bytes": int(torch.cuda.max_memory_allocated()),
                    "memory_source": "cuda_max_allocated", "memory_breakdown": breakdown, **peaks}
        if trace is not None:
            breakdown["live_at_iteration_start"] = trace.baseline_bytes
            return {"peak_memory_bytes": int(trace.peak_bytes), "memory_source": "cpu_alloc_trace",
                    "memory_breakdown": breakdown, **peaks}
        return {"peak_memory_bytes": breakdown.get("rss_peak_delta"), "memory_source": "rss_delta",
                "memory_breakdown": breakdown, **peaks}

    def _progress(self, i: int, n: int, phase: str) -> None:
        if self.rank == 0:
            progress = {"iteration": i, "of": n, "phase": phase}
            write_json_atomic(Path(self.job.out_dir or ".") / "progress.json", progress)


def result_line(result: WorkerResult, path: Path) -> str:
    """The one line rank 0 prints when the run succeeded: iterations, mean ± std s/iter, the fullest rank's peak
    memory, the energy when measured or modelled, and where the whole result is."""
    mean = f"{result.iteration_s_mean:.4g}" if result.iteration_s_mean is not None else "?"
    std = f" ± {result.iteration_s_std:.2g}" if result.iteration_s_std is not None else ""
    peaks = [b for b in result.peak_memory_bytes_per_rank or [] if b is not None]
    memory = f", peak {max(peaks) / 2**30:.2f} GiB per rank" if peaks else ""
    energy = (f", {result.energy_j_per_iter:.4g} J/iter ({result.energy_source or 'energy'})"
              if result.energy_j_per_iter is not None else "")
    return (f"ampe worker: ok, {len(result.iteration_s)} timed iterations, {mean}{std} s/iter{memory}{energy} "
            f"({path})")


def main(argv: list[str] | None = None) -> int:
    """Entry point under torchrun: ``python -m ampe.runtime.worker JOB.json``."""
    t_start = time.perf_counter()
    argv = sys.argv[1:] if argv is None else argv
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if len(argv) != 1:
        sys.stderr.write("usage: python -m ampe.runtime.worker JOB.json (under torchrun)\n")
        return 2
    job_path = Path(argv[0])
    out_dir = job_path.parent
    watch_runner(f"ampe worker rank {rank}")  # ends this rank if the runner dies and the guard with it
    try:
        raw = json.loads(job_path.read_text())
        job = parse_job(raw, job_path)
        out_dir = Path(job.out_dir or job_path.parent)
        report = Trial(job, rank, world, t_start).run()
        if not report["instructions_ok"]:
            sys.stderr.write(f"ampe worker rank {rank}: frequency plan not followed: "
                             f"{report['instruction_mismatch']}\n")
        report = RankReport.parse(report, f"rank{rank}.json").to_json()  # the model the runner reads it with
        write_json_atomic(out_dir / f"rank{rank}.json", report)
        import torch.distributed as dist

        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, report)  # works across hosts, unlike reading rank files
        if rank == 0:
            result = WorkerResult.parse(aggregate(job, gathered, time.perf_counter() - t_start), "result.json")
            write_json_atomic(out_dir / "result.json", result.to_json())
            print(result_line(result, out_dir / "result.json"), flush=True)  # launch_worker.sh's one-line result
        dist.barrier()
        dist.destroy_process_group()
        return 0
    except BaseException as e:
        kind = classify_error(e)
        tb = traceback.format_exc()
        with contextlib.suppress(Exception):
            write_json_atomic(out_dir / f"error_rank{rank}.json",
                              {"kind": kind, "message": f"{type(e).__name__}: {e}"[:2000], "traceback": tb[-4000:]})
        sys.stderr.write(tb)
        if isinstance(e, KeyboardInterrupt):
            return 130
        return 1


if __name__ == "__main__":
    from ampe.runtime.process_exit import exit_skipping_teardown

    exit_skipping_teardown(main())
