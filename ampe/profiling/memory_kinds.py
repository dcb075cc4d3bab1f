"""The activation memory each layer kind of ampe's runtime keeps, measured, against the cost model's figure.

For one model (GPT-2 or Llama family), precision, attention kernel and tensor-parallel degree, :func:`probe_kinds`
builds the first layer of every kind the way the trial worker does (:func:`ampe.profiling.profiler.
build_runtime_layer`), runs one forward on a micro-batch and counts what autograd keeps
(:class:`~ampe.measure.memory_probe.SavedActivations`: parameters and buffers excluded, each storage once) — the
cost model's ``act_bytes(tp) · mbs`` of that layer (:meth:`ampe.costmodel.model.Layer.act_bytes`). The loss is a
transient, not a kept activation: the peak above the logits and what the LM head keeps, over the loss's forward and
backward and the LM head's backward (:class:`~ampe.measure.memory_probe.CpuAllocationTrace`), against
:func:`ampe.costmodel.final_output.loss_bytes`.

At tp > 1 the probe runs in ``tp`` spawned processes joined by gloo (:func:`probe_kinds_tp`), each measuring its
own shard with the real all-reduces, so the figures are one rank's. CPU only (dropout masks there are in the
activations' dtype: :meth:`ampe.costmodel.catalog.GpuType.mask_bytes` of the ``cpu`` catalog entry).
``benchmarks/memory_probe.py`` prints the table, ``tests/profiling/test_memory_kinds.py`` holds the model to it.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ampe.costmodel.catalog import CATALOG
from ampe.costmodel.final_output import loss_bytes
from ampe.costmodel.model import Model

LOSS = "loss"


@dataclass(frozen=True)
class KindMemory:
    """One layer kind's measured and modelled bytes (one micro-batch of ``mbs`` samples on one tp rank)."""

    model: str
    kind: str  # embedding, transformer, norm, logits, or "loss" (the loss's transient peak)
    dtype: str
    attention: str
    tp: int
    mbs: int
    measured_bytes: int
    modelled_bytes: float

    @property
    def error(self) -> float:
        """(modelled − measured) / measured: positive where the model over-counts."""
        return (self.modelled_bytes - self.measured_bytes) / self.measured_bytes


def _first_of_each_kind(model: Model) -> dict[str, int]:
    out: dict[str, int] = {}
    for i, layer in enumerate(model.layers):
        if layer.kind != "noop":
            out.setdefault(layer.kind, i)
    return out


def probe_kinds(model: Model, mbs: int = 1, tp: Any = None, seed: int = 0) -> list[KindMemory]:
    """Measured and modelled activation bytes of each layer kind of ``model`` (its dtype and attention kernel) and
    of its loss, on this process's tensor-parallel shard ``tp`` (a TpGroup; None: tp = 1). CPU."""
    import torch

    from ampe.measure.memory_probe import CpuAllocationTrace, SavedActivations
    from ampe.profiling.profiler import TORCH_DTYPES, build_runtime_layer
    from ampe.runtime.tensor_parallel import TpGroup, vocab_parallel_cross_entropy

    tp = tp or TpGroup.single()
    dtype = getattr(torch, TORCH_DTYPES[model.dtype])
    mask = CATALOG["cpu"].mask_bytes(model.bytes_per_elem)
    gen = torch.Generator().manual_seed(seed)
    s, h = model.seq_len, model.hidden
    tokens = torch.randint(0, model.vocab, (mbs, s), generator=gen)
    labels = torch.randint(0, model.vocab, (mbs, s), generator=gen)
    rows = []

    def row(kind: str, measured: int, modelled: float) -> KindMemory:
        return KindMemory(model.name, kind, model.dtype, model.attention, tp.size, mbs, measured, modelled)

    for kind, i in _first_of_each_kind(model).items():
        torch.manual_seed(i)
        module = build_runtime_layer(model, i, tp).to(dtype).train()
        x = tokens if kind == "embedding" else torch.randn(mbs, s, h, generator=gen).to(dtype).requires_grad_(True)
        with SavedActivations(list(module.parameters()) + list(module.buffers())) as saved:
            out = module(x)
        rows.append(row(kind, saved.live_bytes, model.layers[i].act_bytes(tp.size, mask) * mbs))
        if kind == "logits":  # the loss and the LM head's backward: their peak above the logits and what is kept
            with CpuAllocationTrace() as trace:
                vocab_parallel_cross_entropy(out, labels, tp).backward()
            rows.append(row(LOSS, trace.peak_delta_bytes, loss_bytes(model, mbs, tp.size)))
        del out, module
    return rows


def _tp_child(rank: int, name: str, attentions: tuple[str, ...], dtype: str, tp: int, mbs: int, init_file: str,
              out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from ampe.costmodel.zoo import load_model
    from ampe.runtime.process_exit import exit_skipping_teardown
    from ampe.runtime.tensor_parallel import TpGroup

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=tp)
    try:
        for n, attention in enumerate(attentions):
            rows = probe_kinds(load_model(name, attention, dtype), mbs, TpGroup(tp, rank, dist.group.WORLD))
            Path(out_dir, f"kinds{rank}-{n}.json").write_text(json.dumps([asdict(r) for r in rows]))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    exit_skipping_teardown(0)


def probe_kinds_tp(name: str, attention: str, dtype: str, tp: int, mbs: int = 1) -> list[KindMemory]:
    """:func:`probe_kinds` of zoo model ``name`` at ``tp`` (spawned gloo processes when tp > 1); per kind the
    largest rank's figures."""
    return probe_kinds_tp_each(name, (attention,), dtype, tp, mbs)[attention]


def probe_kinds_tp_each(name: str, attentions: tuple[str, ...], dtype: str, tp: int,
                        mbs: int = 1) -> dict[str, list[KindMemory]]:
    """:func:`probe_kinds_tp` for each attention kernel of ``attentions``, the tp > 1 ones in one set of spawned
    processes (each start imports torch: seconds).

    Args:
        name: a zoo model or a Hugging Face config path.
        attentions: the kernels ("eager", "flash").
        dtype: "fp32" or "bf16".
        tp: tensor-parallel degree (processes).
        mbs: micro-batch size (samples).

    Returns:
        Per kernel, per layer kind the largest rank's figures (bytes).
    """
    from ampe.costmodel.zoo import load_model

    if tp == 1:
        return {a: probe_kinds(load_model(name, a, dtype), mbs) for a in attentions}
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="ampe-kinds-") as tmp:
        mp.start_processes(_tp_child, args=(name, tuple(attentions), dtype, tp, mbs, os.path.join(tmp, "init"), tmp),
                           nprocs=tp, start_method="spawn")
        out = {}
        for n, attention in enumerate(attentions):
            ranks = [[KindMemory(**r) for r in json.loads(Path(tmp, f"kinds{k}-{n}.json").read_text())]
                     for k in range(tp)]
            out[attention] = [max(same, key=lambda r: r.measured_bytes) for same in zip(*ranks, strict=True)]
    return out
