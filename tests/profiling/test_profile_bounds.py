"""``ampe profile`` is estimated and bounded from the cost model before torch is imported (ampe.profiling.bounds)."""

from __future__ import annotations

import pytest

from ampe.costmodel.catalog import CATALOG
from ampe.costmodel.zoo import load_model
from ampe.errors import InputError
from ampe.profiling import bounds

CPU = CATALOG["cpu"]


def test_the_peak_is_the_largest_layer_and_grows_with_mbs_and_shared_tp():
    tiny = load_model("gpt2-tiny")
    one = bounds.estimate(tiny, CPU, [1], [1], 3, 10, "fp32")
    many = bounds.estimate(tiny, CPU, [1], [64], 3, 10, "fp32")
    assert "logits" in one.peak_at and many.peak_bytes > 10 * (one.peak_bytes - bounds.TORCH_BASE_BYTES)
    shared = bounds.estimate(tiny, CPU, [2], [64], 3, 10, "fp32", shared=True)  # two processes on one host
    apart = bounds.estimate(tiny, CPU, [2], [64], 3, 10, "fp32")  # one GPU each
    assert shared.peak_bytes > 1.8 * (apart.peak_bytes - bounds.TORCH_BASE_BYTES)
    block = load_model("gpt3-175b").layers[2]  # 1.8e9 parameters: fp32 weights and gradients, 14.5 GB
    g3 = bounds.estimate(load_model("gpt3-175b"), CPU, [1], [1], 3, 10, "fp32", shared=True)
    assert g3.peak_bytes >= block.params * 8 and "transformer" in g3.peak_at
    bf16 = bounds.estimate(load_model("gpt3-175b"), CPU, [1], [1], 3, 10, "bf16", shared=True)
    assert bf16.peak_bytes >= block.params * 8  # built in fp32, converted to bf16, bf16 gradients


def test_time_is_repeats_times_the_layers():
    tiny = load_model("gpt2-tiny")
    ten = bounds.estimate(tiny, CPU, [1], [1], 0, 9, "fp32").seconds
    hundred = bounds.estimate(tiny, CPU, [1], [1], 0, 99, "fp32").seconds
    assert hundred == pytest.approx(10 * ten)
    assert bounds.estimate(tiny, CPU, [1], [1, 2], 0, 9, "fp32").seconds > ten


def test_runs_beyond_memory_or_time_are_refused_naming_the_flag():
    tiny = load_model("gpt2-tiny")
    cost = bounds.estimate(tiny, CPU, [1], [100_000_000], 3, 10, "fp32")
    with pytest.raises(InputError, match="GiB available") as e:
        bounds.check(cost, 64.0 * (1 << 30), tiny, "this machine")
    assert e.value.source == "--mbs"
    bounds.check(bounds.estimate(tiny, CPU, [1], [1], 3, 10, "fp32"), 64.0 * (1 << 30), tiny, "this machine")
    slow = bounds.estimate(load_model("gpt3-175b"), CPU, [1], [1], 3, 10, "fp32")
    with pytest.raises(InputError, match="h on this machine") as e:
        bounds.check(slow, None, tiny, "this machine")  # memory unknown: the time bound still holds
    assert e.value.source == "--repeats"
    for warmup, repeats in ((-1, 10), (3, 0), (3, bounds.MAX_REPEATS + 1), (bounds.MAX_REPEATS + 1, 10)):
        with pytest.raises(InputError):
            bounds.check_counts(warmup, repeats)
    bounds.check_counts(0, bounds.MAX_REPEATS)
