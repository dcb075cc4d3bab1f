"""Per-layer profiler: forward and backward time and activation memory of the very modules the trial worker runs.

For each (tp, mbs) every layer of the GPT pipe layout is built standalone (:func:`ampe.runtime.gpt_pipe.build_layer`)
and timed on a micro-batch of ``mbs`` samples: ``warmup`` untimed forward+backward pairs, then ``repeats`` timed
pairs; each figure is the *median* of the repeats (robust to the noise of a shared machine). Inputs are what the layer
sees in the pipeline: token ids for the embedding, a ``(mbs, seq, hidden)`` activation that requires grad for every
other layer (so backward computes the input gradient, as it must in a pipeline). The backward pass is driven by a
fixed random output gradient, except the LM head, whose figures include the loss (cross-entropy over the vocabulary)
as it runs on the last stage.

* ``memory_bytes``: bytes autograd keeps for backward after one forward of the layer (saved tensors, parameters and
  buffers excluded, storages counted once), per micro-batch on one tp rank — the cost model's activation memory.
  The LM head's loss is timed with it but its saved log-softmax is not counted here: the cost model charges it
  separately as a one-micro-batch transient. On CPU, PyTorch's dropout keeps a float32 mask (4 bytes per element,
  1 byte on CUDA), so CPU blocks keep about 11% more than Korthikanti's formula.
* tp > 1: ``tp`` processes (gloo on CPU, NCCL on CUDA) each run their shard of the layer *with* its Megatron
  all-reduces, so the all-reduce time is inside ``forward_s``/``backward_s`` as ``ampe.costmodel.profile`` expects; a
  layer's figure is the slowest rank's median. On CPU the processes are pinned to distinct cores (rank mod cores).
* Energy (``forward_j``/``backward_j``) only on CUDA with NVML: after the timed loop the layer's forward+backward
  pair repeats for ENERGY_WINDOW_S (0.5 s) with the counter read around it, and the energy per pair is split
  between forward and backward in proportion to their times. The counter advances in steps of tens of
  milliseconds, far coarser than one layer (an H100 run read 0 J for most layers over a 10-pair window).
* ``device`` is the catalog GPU name: ``cpu``, or the CUDA device name mapped by :func:`catalog_gpu_name`.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ampe.costmodel.model import Model
from ampe.formats.profile import CLOCK_COLUMNS, COLUMNS, ENERGY_COLUMNS, ProfileRow
from ampe.io import write_text_atomic

ENERGY_WINDOW_S = 0.5  # seconds of repeated forward+backward per layer for its energy reading
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


# name fragments in torch.cuda.get_device_name(), checked in order, with the catalog name per memory size (GiB)
_CUDA_NAMES: tuple[tuple[str, Callable[[float], str]], ...] = (
    ("H100", lambda gib: "H100-80GB"),
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
                  layers: Sequence[int] | None = None) -> list[ProfileRow]:
    """Profile every layer (or ``layers``) of ``model`` on this process's shard; see the module docstring."""
    import torch

    from ampe.measure.memory_probe import SavedActivations
    from ampe.runtime.gpt_pipe import build_layer, lm_loss
    from ampe.runtime.tensor_parallel import TpGroup

    tp = TpGroup(tp_size, tp_rank, group)
    dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
    tdtype = getattr(torch, TORCH_DTYPES[dtype])
    sync = _sync(device)
    gen = torch.Generator().manual_seed(1234)
    s, h = model.seq_len, model.hidden
    tokens = torch.randint(0, model.vocab, (mbs, s), generator=gen).to(dev)
    labels = torch.randint(0, model.vocab, (mbs, s), generator=gen).to(dev)
    x0 = torch.randn(mbs, s, h, generator=gen).to(dev, tdtype)
    rows = []
    for i in layers if layers is not None else range(model.num_layers):
        kind = model.layers[i].kind
        torch.manual_seed(i)
        module = build_layer(model, i, tp).to(dev, tdtype).train()
        exclude = list(module.parameters()) + list(module.buffers())
        grad_out = None

        def forward(probe: SavedActivations | None = None, kind: str = kind, module: Any = module) -> Any:
            x = tokens if kind == "embedding" else x0.detach().requires_grad_(True)
            with probe if probe is not None else contextlib.nullcontext():
                out = module(x)
            return lm_loss(out, labels) if kind == "logits" else out  # the loss is timed, not counted as memory

        def backward(out: Any, kind: str = kind) -> None:
            nonlocal grad_out
            if kind == "logits":
                out.backward()
                return
            if grad_out is None:
                grad_out = torch.randn(out.shape, generator=gen).to(dev, out.dtype)
            out.backward(grad_out)

        saved = SavedActivations(exclude)
        out = forward(saved)
        memory = saved.live_bytes
        backward(out)
        del out
        fwd, bwd = [], []
        for r in range(warmup + repeats):
            if group is not None:
                torch.distributed.barrier(group=group)
            sync()
            t0 = time.perf_counter()
            out = forward()
            sync()
            t1 = time.perf_counter()
            backward(out)
            sync()
            t2 = time.perf_counter()
            del out
            module.zero_grad(set_to_none=True)
            if r >= warmup:
                fwd.append(t1 - t0)
                bwd.append(t2 - t1)
        f_s, b_s = statistics.median(fwd), statistics.median(bwd)
        f_j = b_j = None
        if energy is not None:
            joules = _joules_per_pair(lambda: backward(forward()), energy, sync, module, group)
            share = sum(fwd) / (sum(fwd) + sum(bwd)) if sum(fwd) + sum(bwd) > 0 else 0.5
            f_j, b_j = joules * share, joules * (1 - share)
        rows.append(ProfileRow(model=model.name, device=device_name, tp=tp_size, mbs=mbs, layer=i, forward_s=f_s,
                               backward_s=b_s, layer_kind=kind, memory_bytes=int(memory), forward_j=f_j,
                               backward_j=b_j))
    return rows


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
               dtype: str, device_name: str, init_file: str, out_dir: str) -> None:
    """One tensor-parallel profiling process (spawned): joins the group, profiles its shard, writes JSON rows."""
    import torch
    import torch.distributed as dist

    from ampe.costmodel.model import load_model

    if device == "cpu":
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
        torch.set_num_threads(1)
    else:
        torch.cuda.set_device(rank)
    dist.init_process_group("gloo" if device == "cpu" else "nccl", init_method=f"file://{init_file}", rank=rank,
                            world_size=tp)
    try:
        energy = _energy_reader(device)
        model = load_model(model_name)
        rows = []
        for mbs in mbs_list:
            rows += profile_model(model, device, tp, rank, dist.group.WORLD, mbs, warmup, repeats, dtype,
                                  device_name, energy)
        Path(out_dir, f"rows{rank}.json").write_text(json.dumps([r.model_dump() for r in rows]))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # Everything is on disk: skip interpreter teardown, where a C++ thread of gloo occasionally aborts the process
    # ("terminate called without an active exception") after a successful run (as the trial worker does).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _energy_reader(device: str) -> Callable[[], float] | None:
    """Joules-so-far reader of this process's GPU via NVML, or None (CPU, or no NVML)."""
    if device != "cuda":
        return None
    from ampe.measure.freq import NvmlEnergyMeter, nvml_handle, try_init_nvml

    nvml = try_init_nvml()
    if nvml is None:
        return None
    import torch

    bus = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "pci_bus_id", None)
    handle = nvml_handle(nvml, f"{bus:08x}" if isinstance(bus, int) else bus, torch.cuda.current_device())
    return NvmlEnergyMeter(handle, nvml).read_j


def profile(model_name: str, device: str, tp_list: Sequence[int], mbs_list: Sequence[int], warmup: int,
            repeats: int, dtype: str, progress: Callable[[str], None] | None = None) -> list[ProfileRow]:
    """Profile ``model_name`` at every tp and mbs; tp > 1 runs in ``tp`` spawned processes."""
    import torch

    from ampe.costmodel.model import load_model

    model = load_model(model_name)
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        device_name = catalog_gpu_name(torch.cuda.get_device_name(0), props.total_memory)
    else:
        device_name = "cpu"
    rows: list[ProfileRow] = []
    for tp in tp_list:
        t0 = time.perf_counter()
        if tp == 1:
            if device == "cpu":
                torch.set_num_threads(1)  # one core per rank, as in a CPU trial
            energy = _energy_reader(device)
            for mbs in mbs_list:
                rows += profile_model(model, device, 1, 0, None, mbs, warmup, repeats, dtype, device_name, energy)
        else:
            rows += _profile_tp(model_name, device, tp, list(mbs_list), warmup, repeats, dtype, device_name)
        if progress is not None:
            progress(f"tp={tp}: {len(mbs_list)} micro-batch sizes × {model.num_layers} layers in "
                     f"{time.perf_counter() - t0:.1f} s")
    return rows


def _profile_tp(model_name: str, device: str, tp: int, mbs_list: list[int], warmup: int, repeats: int,
                dtype: str, device_name: str) -> list[ProfileRow]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="ampe-profile-") as tmp:
        init_file = os.path.join(tmp, "init")
        mp.start_processes(_tp_worker, args=(model_name, device, tp, mbs_list, warmup, repeats, dtype, device_name,
                                             init_file, tmp), nprocs=tp, start_method="spawn", join=True)
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
    """Write the profile CSV (energy columns only when some row has them), through a temporary file."""
    with_energy = any(r.forward_j is not None for r in rows)
    with_clock = any(r.sm_clock_mhz is not None for r in rows)
    cols = COLUMNS + (ENERGY_COLUMNS if with_energy else ()) + (CLOCK_COLUMNS if with_clock else ())
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for r in rows:
        w.writerow(r.csv_cells(cols))
    write_text_atomic(path, buf.getvalue())
