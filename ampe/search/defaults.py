"""Defaults and advice that fit the model: the default global batch, stages without a transformer block, and what to
say when nothing fits in memory.

Default global batch (``ampe search`` without ``--global-batch``): a tokens-per-batch rule after GPT-3's Table 2.1
(0.5M tokens per batch up to 1B parameters, 1M up to 3B, 2M up to 20B, 4M beyond — Llama 3 trains at 4M), divided by
the model's sequence length and rounded down to a power of two; at most MAX_SAMPLES_PER_DEVICE samples per device
(per-computation clock planning grows with the micro-batches of an iteration: this keeps the default command
interactive), at least 32 samples (the old default) and at least one sample per device. Models under 100M
parameters (test and CPU-trial models) keep 32.
"""

from __future__ import annotations

from ampe.costmodel.cluster import Cluster
from ampe.costmodel.memory import GiB, allocatable_bytes, state_bytes_per_param
from ampe.costmodel.model import Model

SMALL_MODEL_PARAMS = 100_000_000
MAX_SAMPLES_PER_DEVICE = 16
OLD_DEFAULT_GBS = 32
TOKENS_PER_BATCH = ((1e9, 1 << 19), (3e9, 1 << 20), (20e9, 1 << 21), (float("inf"), 1 << 22))


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def default_global_batch(model: Model, cluster: Cluster) -> tuple[int, str]:
    """(samples per iteration, one-line reason) for a search given no global batch (rule in the module docstring)."""
    params = model.unique_params()
    floor = max(OLD_DEFAULT_GBS, _pow2_at_least(cluster.size))
    if params < SMALL_MODEL_PARAMS or model.seq_len <= 0:
        return floor, f"{floor} samples (model under {SMALL_MODEL_PARAMS / 1e6:.0f}M parameters or no sequence length)"
    tokens = next(t for limit, t in TOKENS_PER_BATCH if params < limit)
    samples = max(1, tokens // model.seq_len)
    cap = MAX_SAMPLES_PER_DEVICE * cluster.size
    gbs = 1 << (min(samples, cap).bit_length() - 1)  # round down to a power of two
    gbs = max(gbs, floor)
    capped = f", capped at {MAX_SAMPLES_PER_DEVICE} per device" if samples > cap else ""
    return gbs, (f"{gbs} samples ({gbs * model.seq_len / 2**20:g}M tokens at sequence length {model.seq_len}; "
                 f"GPT-3's batch for {params / 1e9:.2f}B parameters is {tokens / 2**20:g}M tokens{capped}); give "
                 "--global-batch to choose")


def stages_without_blocks(model: Model, partition: tuple[int, ...] | list[int]) -> list[int]:
    """Pipeline positions whose layers include no transformer block (a model with no transformer layers: none)."""
    if not any(layer.kind == "transformer" for layer in model.layers):
        return []
    return [j for j in range(len(partition) - 1)
            if not any(model.layers[i].kind == "transformer" for i in range(partition[j], partition[j + 1]))]


def states_exceed_cluster(model: Model, cluster: Cluster) -> tuple[bool, str]:
    """Whether the model states alone (weights, gradients, optimizer: 16 bytes per parameter at any degrees — ZeRO-1
    shards only the 12 optimizer bytes across replicas, which each hold the rest) exceed the cluster's usable
    memory (the largest allocated peak whose footprint fits each device, with the allocator at its least
    fragmented); with a one-line explanation in GiB."""
    states = model.unique_params() * state_bytes_per_param(model.dtype)
    room = sum(allocatable_bytes(d.gpu, True) - d.gpu.workspace_bytes for d in cluster.devices)
    return states > room, (f"the model states alone ({states / GiB:.1f} GiB: weights, gradients and Adam states) "
                           f"{'exceed' if states > room else 'fit in'} the cluster's {room / GiB:.1f} GiB")
