"""``--cost-model amp``: AMP's cost model and search, reproduced from ampe's inputs (amp.md §2.6-2.7, §3.4, §4.2).

This is a *compatibility* model, bugs included, so that ampe can reproduce AMP's published predictions and
partitions (tests/search/test_amp_compat.py checks every golden row of amp.md §2.9). ampe's own cost model fixes
what is listed here; do not use this one to plan real runs.

What AMP computes, and how it maps onto ampe's inputs:

* **Layer time** ``mbs × 3 × forward_s`` from the profile at mbs 1 (backward = 2 × forward, linear in mbs). On a
  mixed cluster every stage gets the same GPU-count-weighted blend of the per-type profiles (AMP hard-codes
  0.75·V100 + 0.25·T4): per-device speed differences are averaged away.
* **TransGAN** (model name ``transgan*``): the DP runs over AMP's 25 "work layers" (entry 0 and the transformer
  blocks); the other entries cost nothing and cuts only fall right before a work layer. Other models use all
  layers.
* **P2P** at a cut after layer l: ``mbs × out_elems[l]`` elements (÷ tp after a ``logits`` layer; ``noop`` layers
  inherit the previous volume), over the slowest link among the tp shards of the two stages, then the **mean**
  over data-parallel replicas (Eq. 4 says max). Bandwidth in 32-bit elements/s = bytes/s ÷ 4: AMP costs every
  element as fp32.
* **DP sync** per stage and tp shard: ``2(dp-1)/(dp·b) × params/tp`` with AMP's parameter count (12·h² per
  transformer block, h recovered as ⌊√(params/12)⌋ so biases do not count; one h·V per stage holding an embedding
  or logits layer, from the layer's tied parameters) and **b the link from dp-rank dp-1 to dp-rank 0 only** (the
  reference's running-minimum bug). Max over stages and shards; 0 when dp = 1.
* **Partition**: AMP's DP with its quirk (:func:`ampe.dp_assign.amp_pipe_ast`), or, when gas == 1, the
  ``pipe_gpt2`` uniform split (:func:`ampe.dp_assign.uniform_by_count` over transformer blocks).
* **Total** = Eq. 5 (``pipe_cost``) + max DP sync.
* **Candidates**: tp | GPUs per node, dp | devices/tp with gbs % dp == 0, mbs | gbs/dp, pp = devices/(tp·dp);
  Megatron rank order (placement = identity); no memory check.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ampe.costmodel.cluster import Cluster
from ampe.costmodel.model import Model
from ampe.costmodel.profile import Profile
from ampe.costmodel.strategy import Strategy
from ampe.dp_assign import amp_pipe_ast, uniform_by_count
from ampe.dp_assign.costs import check_partition
from ampe.errors import InputError
from ampe.search.space import divisors, node_gcd

AMP_BYTES_PER_ELEM = 4  # AMP's bandwidth unit is 32-bit elements per second
AMP_TIME_FACTOR = 3.0  # forward + backward = 3 × profiled forward


@dataclass(frozen=True)
class AmpPrediction:
    """AMP's prediction for one candidate: the completed strategy and its predicted seconds per iteration."""

    strategy: Strategy  # partition = AMP's choice, placement = identity (Megatron order)
    predicted_s: float  # pipeline_s + sync_s
    pipeline_s: float  # Eq. 5 (AMP's pipe_cost)
    sync_s: float  # max DP-sync over stages and tp shards


def amp_candidates(cluster: Cluster, gbs: int) -> list[tuple[int, int, int, int]]:
    """AMP's enumeration as (pp, dp, tp, mbs): tp | GPUs per node, dp | N/tp with gbs % dp == 0, mbs | gbs/dp."""
    n = cluster.size
    out = []
    for tp in divisors(node_gcd(cluster)):
        for dp in divisors(n // tp):
            if gbs % dp:
                continue
            for mbs in divisors(gbs // dp):
                out.append((n // (tp * dp), dp, tp, mbs))
    return out


def amp_work_layers(model: Model) -> tuple[int, ...]:
    """Layers AMP's DP sees: for TransGAN entry 0 plus the transformer blocks (AMP's 25), else every layer."""
    if model.name.lower().startswith("transgan"):
        return (0, *tuple(i for i, l in enumerate(model.layers) if l.kind == "transformer" and i > 0))
    return tuple(range(model.num_layers))


def amp_layer_times(cluster: Cluster, model: Model, profile: Profile, tp: int, mbs: int) -> np.ndarray:
    """Seconds per layer (L,) as AMP costs them: mbs × Σ_type share × 3 × forward; 0 for non-work layers."""
    types = cluster.gpu_types()
    counts = {g.name: 0 for g in types}
    for d in cluster.devices:
        counts[d.gpu.name] += 1
    per_sample = np.zeros(model.num_layers)
    profile = profile.for_model(model)  # the rows of the model's attention kernel
    for layer in amp_work_layers(model):
        total = 0.0
        for g in types:
            got = profile.layer_time(model.name, g.name, tp, layer, 1)
            if got is None:
                raise InputError(profile.source, f"{model.name}/{g.name}/tp{tp}/layer {layer}",
                                 "no profile row: the AMP cost model needs a measured forward time for every layer")
            total += (counts[g.name] / cluster.size) * (AMP_TIME_FACTOR * got[0])
        per_sample[layer] = total
    return mbs * per_sample


def amp_cut_volumes(model: Model, tp: int, mbs: int) -> np.ndarray:
    """Elements (L,) sent when a stage ends at layer l: mbs × out_elems, ÷ tp from a logits layer on (AMP)."""
    vol = np.zeros(model.num_layers)
    last = 0.0
    for i, layer in enumerate(model.layers):
        if layer.kind != "noop" or i == 0:
            last = mbs * layer.out_elems / (tp if layer.kind == "logits" else 1)
        vol[i] = last
    return vol


def amp_stage_params(model: Model, partition: Sequence[int]) -> list[float]:
    """AMP's parameter count per stage: 12·h² per transformer block + one h·V if it holds an embedding/logits."""
    out = []
    for a, b in itertools.pairwise(partition):
        total, has_embed = 0, 0
        for layer in model.layers[a:b]:
            if layer.kind == "transformer":
                h = math.isqrt(layer.params // 12)
                total += 12 * h * h
            elif layer.kind in ("embedding", "logits"):
                has_embed = max(has_embed, layer.tied_params or layer.params)
        out.append(float(total + has_embed))
    return out


@dataclass(frozen=True)
class _Arrays:
    """AMP's per-candidate tables: layer seconds, cut seconds per boundary, sync link per stage and shard."""

    layer_s: np.ndarray  # (L,)
    cut_s: np.ndarray  # (pp-1, L): boundary j when stage j ends at layer l, mean over replicas
    sync_link: np.ndarray  # (pp, tp) elements/s of the dp-rank (dp-1) → 0 link
    gas: int


def _arrays(cluster: Cluster, model: Model, profile: Profile, pp: int, dp: int, tp: int, mbs: int,
            gbs: int) -> _Arrays:
    s = Strategy(pp, dp, tp, mbs, gbs, placement=tuple(range(pp * dp * tp)))
    bw = cluster.bandwidth  # bytes/s; AMP's unit is elements/s (÷ AMP_BYTES_PER_ELEM per entry)
    vol = amp_cut_volumes(model, tp, mbs)
    cut = np.zeros((pp - 1, model.num_layers))
    for j in range(pp - 1):
        slowest = np.array([min(bw[s.device(j, r, k), s.device(j + 1, r, k)] / AMP_BYTES_PER_ELEM for k in range(tp))
                            for r in range(dp)])
        cut[j] = np.mean(vol[:, None] / slowest[None, :], axis=1)
    link = np.array([[bw[s.device(i, dp - 1, k), s.device(i, 0, k)] / AMP_BYTES_PER_ELEM for k in range(tp)]
                     for i in range(pp)])
    return _Arrays(amp_layer_times(cluster, model, profile, tp, mbs), cut, link, gbs // (dp * mbs))


def _pipe_cost(arr: _Arrays, partition: Sequence[int]) -> float:
    """AMP's pipe_cost (Eq. 5) for a DeepSpeed partition, seconds."""
    p = list(partition)
    stages = [float(arr.layer_s[a:b].sum()) for a, b in itertools.pairwise(p)]
    comm = sum(float(arr.cut_s[j, p[j + 1] - 1]) for j in range(len(p) - 2))
    return (arr.gas - 1) * max(stages) + comm + float(arr.layer_s.sum())


def _sync_cost(arr: _Arrays, model: Model, dp: int, tp: int, partition: Sequence[int]) -> float:
    """AMP's dp_cost with the last-link bug, seconds."""
    if dp == 1:
        return 0.0
    params = amp_stage_params(model, partition)
    return max(2 * (dp - 1) / (dp * arr.sync_link[i, k]) * params[i] / tp
               for i in range(len(params)) for k in range(tp))


def _amp_partition(arr: _Arrays, model: Model, pp: int) -> tuple[int, ...]:
    """AMP's choice: uniform pipe_gpt2 split when gas == 1, else the quirky tolerance DP over the work layers."""
    if pp == 1:
        return (0, model.num_layers)
    if arr.gas == 1:
        return uniform_by_count([l.kind == "transformer" for l in model.layers], pp)
    work = np.asarray(amp_work_layers(model))
    layer_s = arr.layer_s[work]
    last_before_next = np.append(work[1:] - 1, model.num_layers - 1)  # ds layer a cut after work k follows
    cost_c = arr.cut_s[:, last_before_next[:-1]].T  # (Lw-1, pp-1), AMP's orientation
    bounds, _ = amp_pipe_ast(layer_s, cost_c, pp, arr.gas, quirk=True)
    return (0, *tuple(int(work[b]) for b in bounds[1:-1]), model.num_layers)


def amp_predict(cluster: Cluster, model: Model, profile: Profile, pp: int, dp: int, tp: int, mbs: int, gbs: int,
                partition: Sequence[int] | None = None) -> AmpPrediction | None:
    """AMP's predicted iteration seconds for one candidate (its own partition unless ``partition`` is given).

    Returns None when AMP rejects the candidate (more stages than work layers).
    """
    if pp * dp * tp != cluster.size or gbs % (dp * mbs):
        raise ValueError(f"pp·dp·tp = {pp * dp * tp} must equal {cluster.size} and dp·mbs must divide gbs={gbs}")
    if pp > len(amp_work_layers(model)):
        return None
    arr = _arrays(cluster, model, profile, pp, dp, tp, mbs, gbs)
    part = check_partition(partition, pp, model.num_layers) if partition is not None else \
        _amp_partition(arr, model, pp)
    pipe = _pipe_cost(arr, part)
    sync = _sync_cost(arr, model, dp, tp, part)
    strategy = Strategy(pp, dp, tp, mbs, gbs, partition=part, placement=tuple(range(cluster.size)))
    return AmpPrediction(strategy, pipe + sync, pipe, sync)


def amp_cost(cluster: Cluster, model: Model, profile: Profile, pp: int, dp: int, tp: int, mbs: int, gbs: int,
             partition: Sequence[int] | None = None) -> tuple[float, tuple[int, ...] | None]:
    """(predicted seconds per iteration, partition) under AMP's cost model; (inf, None) when AMP rejects it."""
    got = amp_predict(cluster, model, profile, pp, dp, tp, mbs, gbs, partition)
    if got is None:
        return math.inf, None
    return got.predicted_s, got.strategy.partition


def amp_search(cluster: Cluster, model: Model, profile: Profile, gbs: int) -> list[AmpPrediction]:
    """AMP's Algorithm 1 without trials: every candidate costed, sorted by predicted seconds (stable in the
    enumeration order tp, dp, mbs ascending). Candidates AMP rejects (pp > work layers) are left out."""
    preds = []
    for pp, dp, tp, mbs in amp_candidates(cluster, gbs):
        got = amp_predict(cluster, model, profile, pp, dp, tp, mbs, gbs)
        if got is not None:
            preds.append(got)
    preds.sort(key=lambda p: p.predicted_s)
    return preds
