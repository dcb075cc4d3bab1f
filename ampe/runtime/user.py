"""ampe inside the user's own training script: run a strategy that ``ampe export`` wrote, with stock DeepSpeed.

    from ampe.runtime import load_export
    plan = load_export()                         # export.json ($AMPE_EXPORT, set by the exported launch.sh)
    plan.check_host()                            # this rank runs on the host the plan names (and rank 0 is master)
    plan.select_device()                         # pin the core (CPU) or select the GPU of this rank
    deepspeed.init_distributed(dist_backend=plan.dist_backend)
    pipe = plan.pipeline_module(specs, loss_fn=loss)     # any LayerSpec list, split exactly at the plan's parts
    # (or ampe's own layers of the plan's model, with its attention kernel, sharded at tp > 1:
    #  plan.pipeline_module(plan.model_layer_specs(), loss_fn=plan.model_loss()))
    # uneven shares (issue 34): plan.deepspeed_config() is this replica's (its own gas, plan.gas), and the loss must
    # be weighted: loss_fn=plan.weighted_loss(loss), data of plan.gas micro-batches per iteration per replica
    engine, *_ = deepspeed.initialize(model=pipe, model_parameters=..., config=plan.deepspeed_config())
    freq = plan.install_frequency_hook(engine)   # nvml | emulate | none
    with plan.recorder(freq, warmup=2) as rec:
        for _ in range(steps):
            rec.step(engine.train_batch, data_iter=data)

The recorder writes the measurements ``ampe report --measurements`` reads: one JSON object per line,
``{"strategy": {pp, dp, tp, mbs, gbs, partition, placement, schedule, recompute, stage_recompute, zero, attention,
dtype, expandable_segments, replica_gas}, "iteration_s": s | null, "status": "ok" | "oom" | "failed"
[, "peak_memory_bytes"][, "energy_j"]}`` (seconds,
bytes, joules per iteration): the strategy as the plan says it runs — its memory options, attention kernel and
precision included, so the report re-predicts exactly that. The DeepSpeed config (``plan.deepspeed_config()``) names
the plan's optimizer (torch's fused AdamW, the one ``ampe trial`` trains with).
By default one line per run (``per="run"``): the mean over the timed iterations of the slowest rank's time; with
``per="iteration"`` one line per timed iteration. Details: docs/export.md.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ampe.formats.export import ExportFile, RankEntry
from ampe.io import read_json
from ampe.runtime.placement import same_host, visible_gpu_index

EXPORT_ENV = "AMPE_EXPORT"
# the layout, and how it ran: memory options, attention kernel, precision, TF32 (a report re-predicts exactly this)
MEASUREMENT_KEYS = ("pp", "dp", "tp", "mbs", "gbs", "partition", "placement", "schedule", "recompute",
                    "stage_recompute", "zero", "attention", "dtype", "tf32", "expandable_segments", "replica_gas")


class PlacementError(RuntimeError):
    """This rank does not run where the exported plan says (wrong host, or a master address off rank 0's host)."""


def load_export(path: str | Path | None = None, rank: int | None = None) -> ExportedPlan:
    """Read ``export.json`` (default: ``$AMPE_EXPORT``) for this rank (default: ``$RANK``, else 0). Raises
    :class:`~ampe.errors.InputError` naming the file and field for a bad file."""
    if path is None:
        path = os.environ.get(EXPORT_ENV)
        if not path:
            raise RuntimeError(f"no export file: pass load_export(PATH) or set {EXPORT_ENV} (the exported launch.sh "
                               "sets it)")
    doc = ExportFile.parse(read_json(path), str(path))
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    if not 0 <= rank < len(doc.ranks):
        raise RuntimeError(f"rank {rank} is outside the exported plan's {len(doc.ranks)} ranks")
    world = os.environ.get("WORLD_SIZE")
    if world is not None and int(world) != len(doc.ranks):
        raise RuntimeError(f"WORLD_SIZE={world} but the exported plan has {len(doc.ranks)} ranks")
    return ExportedPlan(doc, str(path), rank)


@dataclass
class ExportedPlan:
    """An exported strategy as seen by one rank."""

    file: ExportFile
    source: str
    rank: int
    _tp: Any = field(default=None, repr=False)

    @property
    def place(self) -> RankEntry:
        """This rank's entry of the rank → host/device map."""
        return self.file.ranks[self.rank]

    @property
    def strategy(self) -> dict[str, Any]:
        """pp, dp, tp, mbs, gbs, gas, partition, placement, schedule."""
        return self.file.strategy

    @property
    def parts(self) -> list[int]:
        """Stage boundaries: stage j owns layers ``parts[j] .. parts[j+1]-1``."""
        return list(self.file.parts)

    @property
    def recompute(self) -> str:
        """This rank's stage's activation recomputation in the plan: ``none``, ``selective`` or ``full``."""
        per_stage = self.strategy.get("stage_recompute")
        return str(per_stage[self.place.stage] if per_stage else self.strategy.get("recompute", "none"))

    @property
    def attention(self) -> str:
        """The attention kernel the plan was costed with: ``flash`` (torch SDPA: no s² scores kept) or ``eager``
        (scores written out). Use it in your own attention layers; ampe's own layers use it already. An export
        written before plans named it: the model's default kernel."""
        named = self.strategy.get("attention")
        if named:
            return str(named)
        from ampe.costmodel.zoo import load_model

        return load_model(self.file.model, seq_len=self.file.seq_len).attention

    def model_layer_specs(self, dropout: float | None = None) -> list[Any]:
        """ampe's own DeepSpeed layer specs of the plan's model (a GPT or Llama-family zoo model or Hugging Face
        config: what ``ampe trial``'s worker builds), with the plan's attention kernel, sharded over this rank's
        tensor-parallel group at tp > 1 (created here: every rank calls this, after ``deepspeed.init_distributed``).
        Pass them to :meth:`pipeline_module` with ``loss_fn=plan.model_loss()``."""
        from ampe.costmodel.zoo import load_model
        from ampe.runtime.gpt_pipe import DEFAULT_DROPOUT
        from ampe.runtime.pipeline import model_specs

        model = load_model(self.file.model, self.attention, self.file.dtype, self.file.seq_len)
        return model_specs(model, self.tp_group(), DEFAULT_DROPOUT if dropout is None else dropout)

    def tp_group(self) -> Any:
        """This rank's :class:`~ampe.runtime.tensor_parallel.TpGroup` (process groups created on the first call, by
        every rank; tp = 1: no group)."""
        from ampe.runtime.tensor_parallel import TpGroup, new_tp_groups

        if self._tp is None:
            s = self.strategy
            self._tp = new_tp_groups(s["pp"], s["dp"], s["tp"]) if s["tp"] > 1 else TpGroup.single()
            if self._tp.rank != self.place.shard:
                raise PlacementError(f"rank {self.rank} is shard {self._tp.rank} of its tensor-parallel group, the "
                                     f"plan says {self.place.shard}")
        return self._tp

    def model_loss(self) -> Any:
        """The loss of ampe's own layers (:meth:`model_layer_specs`) for ``PipelineModule(loss_fn=...)``: mean token
        cross-entropy, vocab-parallel over this rank's tensor-parallel group (the last stage's output is its slice of
        the logits at tp > 1)."""
        from ampe.runtime.tensor_parallel import VocabParallelLoss

        return self.weighted_loss(VocabParallelLoss(self.tp_group()))

    @property
    def shares(self) -> tuple[int, ...]:
        """Micro-batches per iteration of each data-parallel replica: the strategy's ``replica_gas`` (uneven shares),
        else ``gas`` each (an export without ``replica_gas``: equal shares)."""
        s = self.strategy
        per = s.get("replica_gas")
        if per:
            return tuple(int(g) for g in per)
        return (int(s.get("gas") or s["gbs"] // (s["dp"] * s["mbs"])),) * int(s["dp"])

    @property
    def gas(self) -> int:
        """Micro-batches this rank's replica runs per iteration (its gradient accumulation steps)."""
        return self.shares[self.place.replica]

    @property
    def loss_weight(self) -> float:
        """The factor on this replica's loss that makes one optimizer step under uneven shares the step of equal
        shares over the same samples, ``gas·dp/Σ gas`` (1.0 for equal shares; derivation in
        :func:`ampe.costmodel.training.loss_weight`)."""
        from ampe.costmodel.training import loss_weight

        return loss_weight(self.shares, self.place.replica)

    def weighted_loss(self, loss_fn: Any) -> Any:
        """``loss_fn`` multiplied by :attr:`loss_weight` (``loss_fn`` itself under equal shares): pass it to
        :meth:`pipeline_module` as ``loss_fn``. :meth:`model_loss` is weighted already."""
        from ampe.runtime.replicas import weighted

        return weighted(loss_fn, self.shares, self.place.replica)

    @property
    def dist_backend(self) -> str:
        """``gloo`` on CPU, ``nccl`` on GPUs."""
        return "gloo" if self.file.device == "cpu" else "nccl"

    def check_host(self, strict: bool = False) -> list[str]:
        """Check that this rank runs on the host the plan names and, on rank 0, that MASTER_ADDR names this host
        (rank 0 serves the rendezvous). Only for the multi-host (deepspeed) launch: torchrun runs every rank here.
        Returns the problems found; prints them as warnings, or raises :class:`PlacementError` when ``strict``."""
        if self.file.launcher != "deepspeed":
            return []
        me = socket.gethostname()
        problems = []
        if not same_host(self.place.host, me):
            problems.append(f"rank {self.rank}: the plan puts it on {self.place.host!r} (node {self.place.node!r}), "
                            f"it runs on {me!r}")
        master = os.environ.get("MASTER_ADDR")
        if self.rank == 0 and master and not same_host(master, me):
            problems.append(f"rank 0 runs on {me!r} but MASTER_ADDR={master!r} names another host")
        if problems and strict:
            raise PlacementError("; ".join(problems))
        for p in problems:
            sys.stderr.write(f"ampe.runtime: warning: {p}\n")
        return problems

    def select_device(self) -> dict[str, Any]:
        """CPU: make sure DeepSpeed's CPU comm op is built and loaded through ampe's build lock
        (:func:`ampe.runtime.prebuild.ensure_op`; the exported ``launch.sh`` prebuilt it, so this is a check of under
        a second), then pin this process to one core (its device id modulo the cores it may use) and one torch
        thread. CUDA: select the rank's GPU (``local_index`` under the launcher's CUDA_VISIBLE_DEVICES) and set
        LOCAL_RANK to it, where DeepSpeed places the engine. Either way it sets TF32 for fp32 matrix products as
        the plan says (:func:`ampe.runtime.precision.apply_tf32`; an export that does not say leaves PyTorch's
        defaults), and the caching allocator gets the plan's ``expandable_segments`` (``PYTORCH_CUDA_ALLOC_CONF``,
        as the exported launch scripts set it; for a rank started another way it takes effect if CUDA is not yet
        initialised). Call before ``deepspeed.init_distributed``."""
        from ampe.costmodel.training import ALLOC_CONF, allocator_conf

        conf = allocator_conf(self.strategy.get("expandable_segments"), os.environ.get(ALLOC_CONF))
        if conf is not None:
            os.environ[ALLOC_CONF] = conf
        import torch

        from ampe.runtime.precision import apply_tf32

        tf32 = self.strategy.get("tf32")
        apply_tf32(torch, tf32 if isinstance(tf32, bool) else None)
        if self.file.device == "cpu":
            from ampe.runtime.prebuild import ensure_op
            from ampe.runtime.worker import pin_cpu

            ensure_op()
            core = pin_cpu(self.place.device)
            torch.set_num_threads(1)
            return {"core": core}
        index = visible_gpu_index(self.place.local_index)
        os.environ["LOCAL_RANK"] = str(index)
        torch.cuda.set_device(index)
        return {"gpu_index": index}

    def topology(self) -> Any:
        """DeepSpeed's ``PipeModelDataParallelTopology`` for pp × dp × tp (rank = stage·dp·tp + replica·tp + shard,
        the order of the rank map)."""
        from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

        s = self.strategy
        return PipeModelDataParallelTopology(num_pp=s["pp"], num_mp=s["tp"], num_dp=s["dp"])

    def pipeline_module(self, specs: list[Any], tensor_parallel: bool = False, **kwargs: Any) -> Any:
        """A stock ``PipelineModule`` over ``specs`` (any ``LayerSpec``/``TiedLayerSpec`` list, one entry per layer of
        the model the plan was made for) whose stage j builds exactly layers ``parts[j]..parts[j+1]-1``. ``kwargs``
        go to ``PipelineModule`` (``loss_fn``, ``activation_checkpoint_interval``, ...). Needs the process group.

        Recomputation follows the plan per stage. With ampe's own layers (:meth:`model_layer_specs`) it is what
        ampe's worker runs: ``full`` checkpoints every transformer block, ``selective`` makes each block re-run its
        core attention. With the user's layers, ``full`` checkpoints every layer (``activation_checkpoint_interval=1``
        unless ``kwargs`` set it; narrow it with ``checkpointable_layers``), and ``selective`` (core attention re-run
        in backward) lives inside the user's layers, so ampe only warns.

        With tp > 1 the layers must shard themselves over the tensor-parallel group (DeepSpeed's ``model`` axis):
        ampe's own layers do (:meth:`model_layer_specs`); user layers must, and say so with
        ``tensor_parallel=True``; otherwise a tp > 1 plan is refused, since plain layers would silently run
        replicated."""
        from ampe.runtime.pipeline import explicit_pipeline_module, recompute_kwargs, seed_kwargs, set_selective

        ours = any(str(getattr(getattr(s, "typename", None), "__module__", "")).startswith("ampe.runtime.")
                   for s in specs)
        if self.strategy["tp"] > 1 and not (tensor_parallel or ours):
            raise ValueError(f"the plan has tp={self.strategy['tp']}: pass tensor_parallel=True if your layers shard "
                             "themselves over the model-parallel group, or export a tp=1 strategy")
        if len(specs) != self.parts[-1]:
            raise ValueError(f"{len(specs)} layer specs, but the plan's model has {self.parts[-1]} layers "
                             f"(parts {self.parts})")
        topo = self.topology()
        coord = topo.get_coord(self.rank)
        if (coord.pipe, coord.data, coord.model) != (self.place.stage, self.place.replica, self.place.shard):
            raise PlacementError(f"DeepSpeed's topology puts rank {self.rank} at {coord}, the plan at stage "
                                 f"{self.place.stage}, replica {self.place.replica}, shard {self.place.shard}")
        if ours:  # ampe's own layers: exactly what ampe's worker runs (full: every Block, non-reentrant; seeded
            # per layer, the worker's default seed)
            for key, value in {**recompute_kwargs(self.recompute), **seed_kwargs(0)}.items():
                kwargs.setdefault(key, value)
        elif self.recompute == "full":
            kwargs.setdefault("activation_checkpoint_interval", 1)
        pipe = explicit_pipeline_module(specs, self.parts, topo, **kwargs)
        if ours:  # gradient clipping's norm counts each of ampe's parameters once over the pipe and tp ranks
            from ampe.runtime.tensor_parallel import mark_grad_norm_owners

            mark_grad_norm_owners(pipe, self.tp_group())
        # ampe's own blocks re-run their core attention in backward when told; user layers must do it themselves
        if self.recompute == "selective" and not set_selective(pipe):
            sys.stderr.write(f"ampe.runtime: warning: the plan costs selective recomputation on stage "
                             f"{self.place.stage} (core attention re-run in backward): checkpoint the attention "
                             "inside your layers; ampe cannot do it for user layers\n")
        bounds = (pipe._local_start, pipe._local_stop)
        if bounds != (self.parts[self.place.stage], self.parts[self.place.stage + 1]):
            raise RuntimeError(f"DeepSpeed built layers {bounds} on stage {self.place.stage}, the plan says "
                               f"{self.parts[self.place.stage]}..{self.parts[self.place.stage + 1]}")
        return pipe

    def deepspeed_config(self, **overrides: Any) -> dict[str, Any]:
        """The exported DeepSpeed config (batch sizes of the strategy; under uneven shares this replica's own
        ``gradient_accumulation_steps`` and ``train_batch_size``), with ``overrides`` applied on top."""
        cfg = json.loads(json.dumps(self.file.deepspeed))
        if self.strategy.get("replica_gas"):
            from ampe.costmodel.training import with_share

            with_share(cfg, self.strategy["mbs"], self.gas, self.strategy["dp"])
        cfg.update(overrides)
        return cfg

    def install_frequency_hook(self, engine: Any, backend: str | None = None) -> Any:
        """Apply this rank's frequency plan to a stock ``PipelineEngine`` (backend ``nvml``, ``emulate`` or ``none``;
        default: the export's). Returns the :class:`~ampe.runtime.frequency.FrequencyRun`; pass it to
        :meth:`recorder`, or use it as a context manager so locked clocks are reset."""
        import torch

        from ampe.costmodel.catalog import CATALOG
        from ampe.runtime.frequency import frequency_run, stage_steps

        fplan = self.file.frequency_plan
        steps = stage_steps(fplan, self.place.stage, self.place.replica) if fplan is not None else None
        gpu = CATALOG[self.place.gpu]
        run = frequency_run(steps, backend or self.file.freq_backend, self.file.device, gpu, self.place.stage, torch)
        return run.install(engine)

    def recorder(self, freq: Any = None, path: str | Path | None = None, warmup: int = 1,
                 per: str = "run") -> MeasurementRecorder:
        """A :class:`MeasurementRecorder` appending to ``path`` (default: the export's ``measurements``)."""
        target = path or self.file.measurements or "measurements.jsonl"
        return MeasurementRecorder(self, freq, Path(target), warmup, per)

    def measurement_strategy(self) -> dict[str, Any]:
        """The ``strategy`` object of a measurements line: the layout and how it runs, defaults written out (no
        recomputation, no ZeRO), so the report assumes nothing."""
        out = {k: self.strategy[k] for k in MEASUREMENT_KEYS if k in self.strategy}
        if "stage_recompute" not in out:
            out.setdefault("recompute", "none")
        out.setdefault("zero", 0)
        torch = sys.modules.get("torch")
        if torch is not None:  # what ran: the flag in force now (set by select_device, or the script's own)
            out["tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
        return out


@dataclass
class MeasurementRecorder:
    """Times each ``engine.train_batch`` (the first ``warmup`` calls are not recorded), reads energy and memory, and
    on close gathers every rank's figures and has rank 0 append the measurements lines. Leaving the ``with`` block
    on an exception appends this rank's failure line (``oom`` or ``failed``) and re-raises."""

    plan: ExportedPlan
    freq: Any  # FrequencyRun | None
    path: Path
    warmup: int = 1
    per: str = "run"  # run | iteration
    iteration_s: list[float] = field(default_factory=list)
    energy_j: list[float] = field(default_factory=list)
    calls: int = 0
    _trace: Any = None
    _rss_base: int | None = None
    _closed: bool = False

    def __post_init__(self) -> None:
        if self.per not in ("run", "iteration"):
            raise ValueError(f"per must be 'run' or 'iteration', got {self.per!r}")
        if self.warmup < 0:
            raise ValueError("warmup must be ≥ 0")
        from ampe.measure import memory_probe

        self._rss_base = memory_probe.rss_bytes()
        memory_probe.reset_rss_peak()

    def __enter__(self) -> MeasurementRecorder:
        if self.freq is not None:
            self.freq.__enter__()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            if exc is not None and not isinstance(exc, KeyboardInterrupt):
                from ampe.runtime.worker import classify_error

                status = "oom" if classify_error(exc) == "oom" else "failed"
                self._append([{"strategy": self.plan.measurement_strategy(), "iteration_s": None, "status": status}])
                self._closed = True
            elif exc is None:
                self.close()
        finally:
            if self.freq is not None:
                self.freq.__exit__(exc_type, exc, tb)

    def step(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run one training iteration ``fn(*args, **kwargs)`` (e.g. ``engine.train_batch``) and record it."""
        import torch

        from ampe.measure import memory_probe

        cuda = self.plan.file.device == "cuda"
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        hook = self.freq.hook if self.freq is not None else None
        energy = self.freq.energy if self.freq is not None else None
        meter = self.freq.meter if self.freq is not None else None
        i = self.calls
        self.calls += 1
        if i < self.warmup:
            if not cuda and i == self.warmup - 1:  # the last warm-up on CPU traces live tensor bytes
                self._trace = memory_probe.CpuAllocationTrace()
                with self._trace:
                    out = fn(*args, **kwargs)
            else:
                out = fn(*args, **kwargs)
            sync()
            if hook is not None:
                hook.end_iteration()
            if energy is not None:
                energy.finish_iteration(0.0)  # discard warm-up energy
            if i == self.warmup - 1:
                _barrier()  # timed iterations start together
            return out
        e0 = meter.read_j() if meter is not None else None
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        sync()
        dt = time.perf_counter() - t0
        if hook is not None:
            hook.end_iteration()
        self.iteration_s.append(dt)
        if meter is not None and e0 is not None:
            self.energy_j.append(meter.read_j() - e0)
        elif energy is not None:
            self.energy_j.append(energy.finish_iteration(dt))
        return out

    def peak_memory_bytes(self) -> int | None:
        """This rank's peak: CUDA max allocated; CPU the live tensor bytes traced over the last warm-up iteration,
        else the RSS high-water mark above the start."""
        from ampe.measure import memory_probe

        if self.plan.file.device == "cuda":
            import torch

            return int(torch.cuda.max_memory_allocated())
        if self._trace is not None:
            return int(self._trace.peak_bytes)
        peak = memory_probe.rss_peak_bytes()
        return None if peak is None or self._rss_base is None else max(0, peak - self._rss_base)

    def rank_figures(self) -> dict[str, Any]:
        """What this rank measured (gathered by :meth:`close`)."""
        return {"rank": self.plan.rank, "host": socket.gethostname(), "iteration_s": list(self.iteration_s),
                "energy_j": list(self.energy_j), "peak_memory_bytes": self.peak_memory_bytes()}

    def close(self) -> list[dict[str, Any]]:
        """Gather every rank's figures (a collective: every rank calls it) and have rank 0 append the lines.
        Returns the lines (rank 0) or [] (other ranks)."""
        if self._closed:
            return []
        self._closed = True
        mine = self.rank_figures()
        ranks = _all_gather(mine)
        if self.plan.rank != 0 and len(ranks) > 1:  # without a process group this process writes its own
            return []
        source = self.freq.energy_source if self.freq is not None else None
        lines = measurement_lines(self.plan.measurement_strategy(), ranks, self.per, source)
        self._append(lines)
        return lines

    def _append(self, lines: list[dict[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        from ampe.formats.measurement import Measurement, measurement_line

        # Through the reader's own model: a line this writes is a line `ampe report --measurements` accepts.
        text = "".join(measurement_line(Measurement.parse(line, str(self.path))) + "\n" for line in lines)
        # Never through a link (the export folder's files are ampe's: docs/export.md), never blocking on a FIFO
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as e:
            raise OSError(e.errno, f"cannot append measurements to {self.path} (a symbolic link or a FIFO there is "
                          f"never written through): {e.strerror}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, f"cannot append measurements to {self.path}: not a regular file")
            os.set_blocking(fd, True)
            os.write(fd, text.encode())  # one write: lines of concurrent runs do not interleave
        finally:
            os.close(fd)


def measurement_lines(strategy: dict[str, Any], ranks: list[dict[str, Any]], per: str = "run",
                      energy_source: str | None = None) -> list[dict[str, Any]]:
    """Measurements lines from every rank's figures: an iteration takes as long as its slowest rank; energy per
    iteration is the sum over ranks (J), labelled with ``energy_source`` (``nvml`` or ``modelled``) when given; peak
    memory the largest rank's (bytes)."""
    n = min(len(r["iteration_s"]) for r in ranks)
    if n == 0:
        return [{"strategy": strategy, "iteration_s": None, "status": "failed"}]
    per_iter = [max(r["iteration_s"][i] for r in ranks) for i in range(n)]
    energy = None
    if all(len(r["energy_j"]) >= n for r in ranks):
        energy = [sum(r["energy_j"][i] for r in ranks) for i in range(n)]
    peaks = [r["peak_memory_bytes"] for r in ranks]
    peak = max(peaks) if all(p is not None for p in peaks) else None

    def line(t: float, e: float | None) -> dict[str, Any]:
        out: dict[str, Any] = {"strategy": strategy, "iteration_s": t, "status": "ok"}
        if peak is not None:
            out["peak_memory_bytes"] = int(peak)
        if e is not None:
            out["energy_j"] = e
            if energy_source is not None:
                out["energy_source"] = energy_source
        return out

    if per == "iteration":
        return [line(per_iter[i], energy[i] if energy else None) for i in range(n)]
    return [line(sum(per_iter) / n, sum(energy) / n if energy else None)]


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _all_gather(obj: Any) -> list[Any]:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
