"""Per-layer profiler: forward and backward time and activation memory of the very modules the trial worker runs.

Every model the trial worker builds can be profiled: the GPT-2 family (zoo, or a model YAML in the GPT pipe layout)
and the Llama family (zoo, or a Hugging Face ``config.json``), with the model's attention kernel
(``eager`` or ``flash``, as ``load_model`` resolves it; each row records it). For each (tp, mbs) every layer is built
standalone (:func:`build_runtime_layer`: ``ampe.runtime.gpt_pipe.build_layer`` or
``ampe.runtime.llama_pipe.build_layer``) and timed on a micro-batch of ``mbs`` samples: ``warmup`` untimed
forward+backward pairs, then ``repeats`` timed pairs; each figure is the *median* of the repeats (robust to the noise
of a shared machine). Inputs are what the layer sees in the pipeline: token ids for the embedding, a
``(mbs, seq, hidden)`` activation that requires grad for every other layer (so backward computes the input gradient,
as it must in a pipeline). The backward pass is driven by a fixed random output gradient, except the LM head, whose
figures include the loss (cross-entropy over the vocabulary, vocab-parallel at tp > 1) as it runs on the last stage.

* Recomputation (``recompute``: any of ``none``, ``selective``, ``full``; one row per layer and mode) is run as the
  trial worker runs it, and measured: ``full`` puts each transformer block (the modules DeepSpeed's
  ``checkpointable_layers`` names, :data:`CHECKPOINTED`) through torch's non-reentrant checkpoint, so its
  ``backward_s`` includes the re-run forward and its ``memory_bytes`` is what the checkpoint keeps (the block's
  input); ``selective`` sets the blocks' ``selective`` attribute (core attention re-run inside the block's
  backward). A layer the mode leaves alone (embedding, norm, LM head, noop) runs exactly as without recomputation in
  the worker, so its row under that mode repeats its ``none`` measurement.

* ``memory_bytes``: bytes autograd keeps for backward after one forward of the layer (saved tensors, parameters and
  buffers excluded, storages counted once), per micro-batch on one tp rank — the cost model's activation memory.
  The LM head's loss is timed with it but its saved log-softmax is not counted here: the cost model charges it
  separately as a one-micro-batch transient. On CPU, PyTorch's dropout keeps a float32 mask (4 bytes per element,
  1 byte on CUDA), so CPU blocks keep about 11% more than Korthikanti's formula.
* tp > 1: ``tp`` processes (gloo on CPU, NCCL on CUDA) each run their shard of the layer *with* its Megatron
  all-reduces, so the all-reduce time is inside ``forward_s``/``backward_s`` as ``ampe.costmodel.profile`` expects; a
  layer's figure is the slowest rank's median. On CPU the processes are pinned to distinct cores (rank mod cores).
* Energy (``forward_j``/``backward_j``, with ``energy_source``): on CUDA from NVML (``nvml``); on the CPU, when
  asked, from the modelled meter (:class:`ampe.measure.freq.ModelledEnergyMeter`, labelled ``modelled …``: the
  columns and the code path of a GPU profile, never a measurement). After the timed loop the layer's
  forward+backward pair repeats for ENERGY_WINDOW_S (0.5 s) with the meter read around it, and the energy per pair
  is split between forward and backward in proportion to their times. NVML's counter advances in steps of tens of
  milliseconds, far coarser than one layer (an H100 run read 0 J for most layers over a 10-pair window).
* Identical layers (``identical="once"``): a layer whose spec equals an earlier one's (Llama's and GPT's blocks, the
  GPT layout's noops) is not measured again; its rows repeat the first one's figures, with ``same_as_layer`` naming
  it (:mod:`ampe.profiling.identical`).
* ``device`` is the catalog GPU name: ``cpu``, or the CUDA device name mapped by :func:`catalog_gpu_name`.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from ampe.costmodel.model import Model
from ampe.formats.profile import Attention, ProfileRow, Recompute, profile_csv_text
from ampe.io import write_text_atomic

ENERGY_WINDOW_S = 0.5  # seconds of repeated forward+backward per layer for its energy reading
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
RECOMPUTE = ("none", "selective", "full")  # measured in this order (the "none" row is reused by untouched layers)
# Module classes full recomputation checkpoints: the trial worker's DeepSpeed `checkpointable_layers` (GPT and Llama
# blocks are both named Block)
CHECKPOINTED = ("Block",)
clock: Callable[[], float] = time.perf_counter  # seconds; the timer of every measurement


def check_buildable(model: Model) -> None:
    """ValueError (one line) unless the trial worker can build ``model``: a GPT-2-family layer list, or a
    Llama-family model built from a config (zoo name or Hugging Face ``config.json``)."""
    if model.family == "llama":
        from ampe.runtime.llama_pipe import check_llama_layout

        check_llama_layout(model)
        return
    from ampe.runtime.gpt_pipe import check_gpt_layout

    try:
        check_gpt_layout(model)
    except ValueError as e:
        if model.config is not None:  # built from a config: the layout is right, a dimension is not
            raise
        raise ValueError(f"model {model.name!r} ({model.source}) is a layer list without a config and not in the GPT-2 "
                         "pipe layout (embedding, noop, blocks, noop, norm, logits, noop with hidden/heads/vocab/"
                         "seq_len set): the trial worker cannot build it, so there is nothing to measure (profile a "
                         "zoo model, a Hugging Face config.json or a GPT-layout model YAML)") from e


def build_runtime_layer(model: Model, index: int, tp: Any = None) -> Any:
    """Layer ``index`` of ``model`` as the trial worker builds it (a torch module), on tensor-parallel group ``tp``
    (a :class:`ampe.runtime.tensor_parallel.TpGroup`; None: tp = 1)."""
    if model.family == "llama":
        from ampe.runtime.llama_pipe import build_layer as llama_layer

        return llama_layer(model, index, tp)
    from ampe.runtime.gpt_pipe import build_layer

    return build_layer(model, index, tp)


# name fragments in torch.cuda.get_device_name(), checked in order, with the catalog name per memory size (GiB)
_CUDA_NAMES: tuple[tuple[str, Callable[[float], str]], ...] = (
    ("H200", lambda gib: "H200"),
    ("H100", lambda gib: "H100-80GB"),  # the SXM entry, also for an H100 PCIe (350 W): add a spec type for that
    ("A100", lambda gib: "A100-80GB" if gib > 48 else "A100-40GB"),
    ("A40", lambda gib: "A40"),
    ("V100", lambda gib: "V100-32GB" if gib > 20 else "V100-16GB"),
    ("T4", lambda gib: "T4"),
    ("3090", lambda gib: "RTX3090"),
)


def catalog_gpu_name(device_name: str, total_memory_bytes: int) -> str:
    """Catalog name of a CUDA device from ``torch.cuda.get_device_name`` and its memory; ValueError if unknown."""
    gib = total_memory_bytes / (1 << 30)
    for fragment, pick in _CUDA_NAMES:
        if fragment in device_name.upper():
            return pick(gib)
    raise ValueError(f"GPU {device_name!r} ({gib:.0f} GiB) is not in the catalog; add it to "
                     "ampe/costmodel/catalog.py (or a cluster spec's gpu_types) to profile it")


def _sync(device: str) -> Callable[[], None]:
    import torch

    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def profile_model(model: Model, device: str, tp_size: int, tp_rank: int, group: Any, mbs: int, warmup: int,
                  repeats: int, dtype: str, device_name: str, energy: Callable[[], float] | None = None,
                  layers: Sequence[int] | None = None, recompute: Sequence[str] = ("none",)) -> list[ProfileRow]:
    """Profile every layer (or ``layers``) of ``model`` on this process's shard under each ``recompute`` mode; see
    the module docstring."""
    import torch

    from ampe.runtime.precision import apply_tf32
    from ampe.runtime.tensor_parallel import TpGroup, VocabParallelLoss

    # fp32 rows are measured without TF32, whatever the process had: the cost model scales them for a TF32 plan
    # (ampe.costmodel.compute, docs/cost_model.md)
    apply_tf32(torch, False)
    unknown = set(recompute) - set(RECOMPUTE)
    if unknown or not recompute:
        raise ValueError(f"recompute must be a non-empty subset of {', '.join(RECOMPUTE)}, got {list(recompute)}")
    modes = [m for m in RECOMPUTE if m in recompute]
    tp = TpGroup(tp_size, tp_rank, group)
    dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
    tdtype = getattr(torch, TORCH_DTYPES[dtype])
    gen = torch.Generator().manual_seed(1234)
    s, h = model.seq_len, model.hidden
    tokens = torch.randint(0, model.vocab, (mbs, s), generator=gen).to(dev)
    labels = torch.randint(0, model.vocab, (mbs, s), generator=gen).to(dev)
    x0 = torch.randn(mbs, s, h, generator=gen).to(dev, tdtype)
    rows = []
    for i in layers if layers is not None else range(model.num_layers):
        kind = model.layers[i].kind
        torch.manual_seed(i)
        module = build_runtime_layer(model, i, tp).to(dev, tdtype).train()
        probe = _LayerProbe(module, kind, tokens, labels, x0, VocabParallelLoss(tp), gen, device, group)
        plain: ProfileRow | None = None  # this layer measured as it runs without recomputation
        for mode in modes:
            checkpointed = mode == "full" and type(module).__name__ in CHECKPOINTED
            selective = mode == "selective" and hasattr(module, "selective")
            if not (checkpointed or selective) and plain is not None:
                rows.append(plain.model_copy(update={"recompute": mode}))  # the worker runs it unchanged
                continue
            if hasattr(module, "selective"):
                module.selective = selective
            f_s, b_s, memory, f_j, b_j = probe.measure(checkpointed, warmup, repeats, energy)
            row = ProfileRow(model=model.name, device=device_name, tp=tp_size, mbs=mbs, layer=i, forward_s=f_s,
                             backward_s=b_s, layer_kind=kind, memory_bytes=int(memory), forward_j=f_j,
                             backward_j=b_j, attention=cast(Attention, model.attention),
                             recompute=cast(Recompute, mode))
            if not (checkpointed or selective):
                plain = row
            rows.append(row)
    return rows


class _LayerProbe:
    """Times and measures one layer module (forward, backward, kept activations, energy) on fixed inputs."""

    def __init__(self, module: Any, kind: str, tokens: Any, labels: Any, x0: Any, loss: Callable[[Any, Any], Any],
                 gen: Any, device: str, group: Any) -> None:
        self.module, self.kind, self.tokens, self.labels, self.x0 = module, kind, tokens, labels, x0
        self.loss, self.gen, self.group, self.sync = loss, gen, group, _sync(device)
        self.exclude = list(module.parameters()) + list(module.buffers())
        self.grad_out: Any = None

    def forward(self, checkpointed: bool, probe: Any = None) -> Any:
        """One forward (through torch's non-reentrant checkpoint when ``checkpointed``, as DeepSpeed's
        ``activation_checkpoint_func`` runs it), the LM head's with its loss (timed, not counted as memory)."""
        from torch.utils.checkpoint import checkpoint

        x = self.tokens if self.kind == "embedding" else self.x0.detach().requires_grad_(True)
        with probe if probe is not None else contextlib.nullcontext():
            out = checkpoint(self.module, x, use_reentrant=False) if checkpointed else self.module(x)
        return self.loss(out, self.labels) if self.kind == "logits" else out

    def backward(self, out: Any) -> None:
        """Backward from the loss (LM head) or a fixed random output gradient."""
        import torch

        if self.kind == "logits":
            out.backward()
            return
        if self.grad_out is None:
            self.grad_out = torch.randn(out.shape, generator=self.gen).to(out.device, out.dtype)
        out.backward(self.grad_out)

    def measure(self, checkpointed: bool, warmup: int, repeats: int, energy: Callable[[], float] | None
                ) -> tuple[float, float, float, float | None, float | None]:
        """(median forward s, median backward s, kept bytes, forward J, backward J); joules None without a meter."""
        import torch

        from ampe.measure.memory_probe import SavedActivations

        saved = SavedActivations(self.exclude)
        out = self.forward(checkpointed, saved)
        memory = saved.live_bytes
        self.backward(out)
        del out
        self.module.zero_grad(set_to_none=True)
        fwd, bwd = [], []
        for r in range(warmup + repeats):
            if self.group is not None:
                torch.distributed.barrier(group=self.group)
            self.sync()
            t0 = clock()
            out = self.forward(checkpointed)
            self.sync()
            t1 = clock()
            self.backward(out)
            self.sync()
            t2 = clock()
            del out
            self.module.zero_grad(set_to_none=True)
            if r >= warmup:
                fwd.append(t1 - t0)
                bwd.append(t2 - t1)
        f_j = b_j = None
        if energy is not None:
            joules = _joules_per_pair(lambda: self.backward(self.forward(checkpointed)), energy, self.sync,
                                      self.module, self.group)
            share = sum(fwd) / (sum(fwd) + sum(bwd)) if sum(fwd) + sum(bwd) > 0 else 0.5
            f_j, b_j = joules * share, joules * (1 - share)
        return statistics.median(fwd), statistics.median(bwd), memory, f_j, b_j


def _joules_per_pair(pair: Callable[[], None], energy: Callable[[], float], sync: Callable[[], None], module: Any,
                     group: Any, window_s: float | None = None) -> float:
    """Energy (joules) of one forward+backward pair, from the counter read around at least ``window_s`` seconds.

    NVML's total-energy counter advances in steps of tens of milliseconds, so a window of a few milliseconds reads
    0 or one whole step; repeating the pair for ENERGY_WINDOW_S keeps that quantisation error to a few percent."""
    import torch

    window_s = ENERGY_WINDOW_S if window_s is None else window_s
    sync()
    e0, t0, pairs = energy(), time.perf_counter(), 0
    while True:
        if group is not None:  # the tp ranks stay in step: their all-reduces pair up
            torch.distributed.barrier(group=group)
        pair()
        module.zero_grad(set_to_none=True)
        pairs += 1
        sync()
        elapsed = time.perf_counter() - t0
        if group is not None:  # every rank stops after the same number of pairs
            on = "cuda" if torch.distributed.get_backend(group) == "nccl" else "cpu"
            flag = torch.tensor([1.0 if elapsed >= window_s else 0.0], device=on)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN, group=group)
            done = bool(flag.item())
        else:
            done = elapsed >= window_s
        if done:
            return (energy() - e0) / pairs


def _tp_worker(rank: int, model_name: str, device: str, tp: int, mbs_list: list[int], warmup: int, repeats: int,
               dtype: str, device_name: str, init_file: str, out_dir: str, attention: str | None = None,
               recompute: Sequence[str] = ("none",), read_energy: bool = True, seq_len: int | None = None,
               layers: Sequence[int] | None = None) -> None:
    """One tensor-parallel profiling process (spawned): joins the group, profiles its shard, writes JSON rows."""
    import torch
    import torch.distributed as dist

    from ampe.costmodel.zoo import load_model
    from ampe.runtime.process_exit import exit_skipping_teardown

    if device == "cpu":
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
        torch.set_num_threads(1)
    else:
        torch.cuda.set_device(rank)
    dist.init_process_group("gloo" if device == "cpu" else "nccl", init_method=f"file://{init_file}", rank=rank,
                            world_size=tp)
    try:
        energy = _energy_reader(device) if read_energy else None
        model = load_model(model_name, attention, seq_len=seq_len)
        rows = []
        for mbs in mbs_list:
            rows += profile_model(model, device, tp, rank, dist.group.WORLD, mbs, warmup, repeats, dtype,
                                  device_name, energy, layers=layers, recompute=recompute)
        Path(out_dir, f"rows{rank}.json").write_text(json.dumps([r.model_dump() for r in rows]))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    exit_skipping_teardown(0)


def _energy_reader(device: str) -> Callable[[], float] | None:
    """Joules-so-far reader of this process's device: its GPU via NVML (None without NVML), or on the CPU the
    modelled meter (:func:`energy_source` labels the rows)."""
    if device != "cuda":
        from ampe.costmodel.catalog import CATALOG
        from ampe.measure.freq import ModelledEnergyMeter, gpu_dvfs

        cpu = CATALOG["cpu"]
        return ModelledEnergyMeter(gpu_dvfs(cpu), cpu.sm_clock_max_mhz).read_j
    from ampe.measure.freq import NvmlEnergyMeter, nvml_handle, try_init_nvml

    nvml = try_init_nvml()
    if nvml is None:
        return None
    import torch

    bus = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "pci_bus_id", None)
    handle = nvml_handle(nvml, f"{bus:08x}" if isinstance(bus, int) else bus, torch.cuda.current_device())
    return NvmlEnergyMeter(handle, nvml).read_j


def energy_source(device: str) -> str:
    """What the joules of a profile on ``device`` are: ``nvml`` (measured) on CUDA, else the modelled meter's label."""
    from ampe.measure.freq import MODELLED_METER

    return "nvml" if device == "cuda" else MODELLED_METER


def profile(model_name: str, device: str, tp_list: Sequence[int], mbs_list: Sequence[int], warmup: int,
            repeats: int, dtype: str, progress: Callable[[str], None] | None = None, attention: str | None = None,
            recompute: Sequence[str] = ("none",), read_energy: bool = True, seq_len: int | None = None,
            identical: str = "each") -> list[ProfileRow]:
    """Profile ``model_name`` (with ``attention``; None: the model's default kernel; ``seq_len``: a Hugging Face
    config's sequence length) at every tp and mbs under each
    ``recompute`` mode; tp > 1 runs in ``tp`` spawned processes. ``read_energy`` False skips the energy window
    of each layer (ENERGY_WINDOW_S per layer, mode and micro-batch size: a minute for a 20-layer model at 3 × 2);
    True reads NVML on CUDA and the modelled meter on the CPU (rows labelled by :func:`energy_source`).
    ``identical``: ``each`` measures every layer, ``once`` the first of identical layers only (the module
    docstring)."""
    if device == "cpu":  # DeepSpeed's CPU accelerator, chosen here: unset, DeepSpeed warns on every import
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch

    from ampe.costmodel.zoo import load_model

    model = load_model(model_name, attention, seq_len=seq_len)
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        device_name = catalog_gpu_name(torch.cuda.get_device_name(0), props.total_memory)
    else:
        device_name = "cpu"
    modes = "/".join(m for m in RECOMPUTE if m in recompute)
    from ampe.profiling.identical import identical_layers, repeat_rows

    same = identical_layers(model) if identical == "once" else {}
    layers = [i for i in range(model.num_layers) if i not in same]
    rows: list[ProfileRow] = []
    for tp in tp_list:
        t0 = time.perf_counter()
        ran = ""
        if tp == 1:
            from ampe.runtime.attention import kernel_ran

            if device == "cpu":
                torch.set_num_threads(1)  # one core per rank, as in a CPU trial
            energy = _energy_reader(device) if read_energy else None
            for mbs in mbs_list:
                rows += profile_model(model, device, 1, 0, None, mbs, warmup, repeats, dtype, device_name, energy,
                                      layers=layers, recompute=recompute)
            ran = f", torch ran {kernel_ran()}" if model.attention == "flash" and kernel_ran() else ""
        else:
            rows += _profile_tp(model_name, device, tp, list(mbs_list), warmup, repeats, dtype, device_name,
                                model.attention, recompute, read_energy, seq_len, layers)
        if progress is not None:
            once = f" ({len(layers)} measured, the rest identical)" if same else ""
            sizes = "micro-batch size" if len(mbs_list) == 1 else "micro-batch sizes"
            progress(f"tp={tp}: {len(mbs_list)} {sizes} × {model.num_layers} layers{once}, recompute "
                     f"{modes}, {model.attention} attention{ran}, in {time.perf_counter() - t0:.1f} s")
    source = energy_source(device)
    rows = [r.model_copy(update={"energy_source": source}) if r.forward_j is not None else r for r in rows]
    return repeat_rows(rows, same)


def _profile_tp(model_name: str, device: str, tp: int, mbs_list: list[int], warmup: int, repeats: int,
                dtype: str, device_name: str, attention: str | None = None, recompute: Sequence[str] = ("none",),
                read_energy: bool = True, seq_len: int | None = None, layers: Sequence[int] | None = None
                ) -> list[ProfileRow]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="ampe-profile-") as tmp:
        init_file = os.path.join(tmp, "init")
        mp.start_processes(_tp_worker, args=(model_name, device, tp, mbs_list, warmup, repeats, dtype, device_name,
                                             init_file, tmp, attention, list(recompute), read_energy, seq_len,
                                             None if layers is None else list(layers)),
                           nprocs=tp,
                           start_method="spawn", join=True)
        per_rank = [[ProfileRow.model_validate(r) for r in json.loads(Path(tmp, f"rows{k}.json").read_text())]
                    for k in range(tp)]
    merged = []
    for rows in zip(*per_rank, strict=False):  # the slowest shard sets the pipeline's pace
        slow_f = max(rows, key=lambda r: r.forward_s)
        slow_b = max(rows, key=lambda r: r.backward_s)
        merged.append(rows[0].model_copy(update={"forward_s": slow_f.forward_s, "backward_s": slow_b.backward_s,
                                                 "memory_bytes": max(r.memory_bytes or 0.0 for r in rows),
                                                 "forward_j": slow_f.forward_j, "backward_j": slow_b.backward_j}))
    return merged


def write_profile_csv(rows: Sequence[ProfileRow], path: str | Path) -> None:
    """Write the profile CSV (optional columns only where some row has them,
    :func:`ampe.formats.profile.profile_csv_text`), through a temporary file."""
    write_text_atomic(path, profile_csv_text(rows))
