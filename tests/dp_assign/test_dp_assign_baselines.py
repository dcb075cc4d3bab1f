"""Baseline partitions: AMP's pipe_gpt2 rule, DeepSpeed's uniform / balanced methods (against DeepSpeed itself)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ampe.costmodel.zoo import load_model
from ampe.dp_assign import balanced_partition, uniform_by_count, uniform_layers, uniform_parameters


def _transformers(name):
    return [layer.kind == "transformer" for layer in load_model(name).layers]


@pytest.mark.parametrize("model,pp,want", [
    ("gpt2-amp", 2, (0, 14, 30)),
    ("gpt2-amp", 4, (0, 8, 14, 20, 30)),
    ("gpt2-amp", 8, (0, 5, 8, 11, 14, 17, 20, 23, 30)),
    ("transgan", 2, (0, 41, 56)),
    ("transgan", 4, (0, 9, 41, 47, 56)),
])
def test_published_megatron_partitions(model, pp, want):
    counted = _transformers(model)
    assert uniform_by_count(counted, pp) == want
    # DeepSpeed's `type:transformer` (balanced binary weights) agrees on these
    assert balanced_partition([float(c) for c in counted], pp) == want


def test_pipe_gpt2_is_plus_two_first_plus_four_last():
    counted = _transformers("gpt2-amp")
    for pp in range(1, 25):
        sizes = np.diff(uniform_by_count(counted, pp))
        base, extra = divmod(24, pp)
        want = [base + (j < extra) for j in range(pp)]
        want[0] += 2
        want[-1] += 4
        assert list(sizes) == want
    with pytest.raises(ValueError):
        uniform_by_count(counted, 25)


def test_uniform_layers():
    assert uniform_layers(30, 4) == (0, 8, 16, 23, 30)
    assert uniform_layers(5, 5) == (0, 1, 2, 3, 4, 5)
    with pytest.raises(ValueError):
        uniform_layers(3, 4)


def _range_of(weights, parts):
    sums = [sum(weights[a:b]) for a, b in itertools.pairwise(parts)]
    return max(sums) - min(sums)


def test_balanced_partition_minimises_the_range_brute_force():
    rng = np.random.default_rng(2)
    for _ in range(60):
        n = int(rng.integers(2, 10))
        pp = int(rng.integers(1, n + 1))
        w = list(rng.integers(0, 20, n).astype(float))
        parts = balanced_partition(w, pp)
        best = min(_range_of(w, (0, *c, n)) for c in itertools.combinations(range(1, n), pp - 1))
        assert _range_of(w, parts) == best


def test_balanced_partition_equals_deepspeed():
    ds_utils = pytest.importorskip("deepspeed.runtime.utils")  # optional `trial` extra: an oracle, not a feature
    rng = np.random.default_rng(3)
    for _ in range(40):
        n = int(rng.integers(2, 40))
        pp = int(rng.integers(1, min(n, 16) + 1))
        w = list(rng.integers(0, 5, n)) if rng.random() < 0.5 else list(rng.random(n) * 100)
        assert balanced_partition(w, pp) == tuple(int(x) for x in ds_utils.partition_balanced(w, pp))
    for n, pp in ((30, 4), (56, 16), (7, 7)):
        assert uniform_layers(n, pp) == tuple(ds_utils.partition_uniform(n, pp))


def test_uniform_parameters_on_gpt2():
    model = load_model("gpt2-amp")
    params = [layer.params for layer in model.layers]
    parts = uniform_parameters(params, 4)
    # the two tied embedding copies (53.5M each ≈ 4.2 blocks) sit on the first and last stage: 4/8/8/4 blocks
    assert parts == (0, 6, 14, 22, 30)
    blocks = [sum(layer.kind == "transformer" for layer in model.layers[a:b]) for a, b in itertools.pairwise(parts)]
    assert blocks == [4, 8, 8, 4]
