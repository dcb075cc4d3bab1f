"""``ampe profile``: the CSV it writes loads with ``ampe.costmodel.profile.load_profile`` and covers every layer; its
memory column is the activation bytes the layers keep; bad arguments are one-line errors with exit code 2."""

from __future__ import annotations

import csv

import pytest
import torch

from ampe.costmodel.catalog import CATALOG
from ampe.costmodel.profile import load_profile
from ampe.costmodel.zoo import load_model
from ampe.formats.profile import ProfileRow
from ampe.profiling import profiler
from ampe.profiling.profiler import catalog_gpu_name, profile_model, write_profile_csv


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory):
    from ampe.cli import main

    out = tmp_path_factory.mktemp("prof") / "profile.csv"
    assert main(["profile", "--model", "gpt2-tiny", "--mbs", "1,2", "--warmup", "1", "--repeats", "3",
                 "--out", str(out)]) == 0
    return out


def test_profile_csv_loads_and_covers_every_layer(tiny_profile):
    model = load_model("gpt2-tiny")
    prof = load_profile(tiny_profile)
    assert prof.models() == {"gpt2-tiny"} and prof.devices("gpt2-tiny") == {"cpu"}
    assert prof.tps("gpt2-tiny", "cpu") == {1}
    assert prof.covers("gpt2-tiny", "cpu", 1, model.num_layers)
    for i, layer in enumerate(model.layers):
        assert prof.kinds[("gpt2-tiny", i)] == layer.kind
        fwd, bwd = prof.layer_time("gpt2-tiny", "cpu", 1, i, 2)
        assert fwd > 0 and bwd > 0
    with tiny_profile.open() as f:
        header = next(csv.reader(f))
    assert header == ["model", "device", "tp", "mbs", "layer", "forward_s", "backward_s", "layer_kind", "memory_bytes",
                      "attention", "recompute"]


def test_profile_memory_is_the_activation_memory(tiny_profile):
    model = load_model("gpt2-tiny")
    prof = load_profile(tiny_profile)
    for i, layer in enumerate(model.layers):
        m1 = prof.layer_memory("gpt2-tiny", "cpu", 1, i, 1)
        m2 = prof.layer_memory("gpt2-tiny", "cpu", 1, i, 2)
        assert m2 == pytest.approx(2 * m1, rel=0.02)  # activations scale with the micro-batch
        if layer.kind == "noop":
            assert m1 == 0
        if layer.kind in ("transformer", "norm", "logits"):
            # Korthikanti et al. at fp32 with PyTorch's CPU dropout masks (float32: 4 B per element, catalog `cpu`)
            want = layer.act_bytes(1, mask_bytes=CATALOG["cpu"].mask_bytes(4))
            assert want <= m1 <= 1.03 * want, (i, layer.kind, m1, want)


@pytest.mark.trial
def test_tp2_profile_runs_the_shards_with_their_allreduces(tmp_path, run_cli):
    out = tmp_path / "tp.csv"
    code, _, err = run_cli("profile", "--model", "gpt2-tiny", "--tp", "2", "--mbs", "1", "--warmup", "1",
                           "--repeats", "2", "--out", str(out))
    assert code == 0, err
    prof = load_profile(out)
    model = load_model("gpt2-tiny")
    assert prof.covers("gpt2-tiny", "cpu", 2, model.num_layers)
    block = model.layers[2]
    m = prof.layer_memory("gpt2-tiny", "cpu", 2, 2, 1)
    want = block.act_bytes(2, mask_bytes=CATALOG["cpu"].mask_bytes(4))
    assert want <= m <= 1.03 * want


def test_energy_columns_are_written_when_measured_and_still_load(tmp_path):
    rows = [ProfileRow(model="gpt2-tiny", device="A100-40GB", tp=1, mbs=1, layer=i, forward_s=0.001, backward_s=0.002,
                       layer_kind="noop", memory_bytes=0, forward_j=0.3, backward_j=0.6, energy_source="nvml")
            for i in range(10)]
    out = tmp_path / "e.csv"
    write_profile_csv(rows, out)
    with out.open() as f:
        header, first = next(csv.reader(f)), next(csv.reader(f))
    assert header[-3:] == ["forward_j", "backward_j", "energy_source"] and first[-1] == "nvml"
    assert load_profile(out).covers("gpt2-tiny", "A100-40GB", 1, 10)


def test_layer_energy_survives_a_coarse_energy_counter(monkeypatch):
    """NVML's counter advances in steps of tens of ms; a layer's energy is read over a window far longer, so each
    row gets a non-zero share of it (a window of one pair would read 0 J for most layers)."""
    import time

    watts, step_s = 100.0, 0.01
    t0 = time.perf_counter()

    def coarse_counter_j() -> float:  # a constant 100 W, visible only in 10 ms steps
        return watts * step_s * ((time.perf_counter() - t0) // step_s)

    monkeypatch.setattr(profiler, "ENERGY_WINDOW_S", 0.2)
    model = load_model("gpt2-tiny")
    rows = profile_model(model, "cpu", 1, 0, None, 1, 1, 3, "fp32", "cpu", energy=coarse_counter_j, layers=[2, 3])
    for row in rows:
        assert row.forward_j > 0 and row.backward_j > 0


def test_energy_per_pair_is_the_counter_over_the_window_divided_by_pairs():
    """Whatever the machine's speed: J per pair = power × the window's wall time / pairs, within the counter's
    quantisation (one 10 ms step over a window of at least 200 ms)."""
    import time

    watts, step_s, window_s = 100.0, 0.01, 0.2
    t0 = time.perf_counter()
    calls = []

    def coarse_counter_j() -> float:
        return watts * step_s * ((time.perf_counter() - t0) // step_s)

    def pair() -> None:
        calls.append(time.perf_counter())
        sum(range(20000))

    class Module:
        def zero_grad(self, set_to_none: bool = True) -> None:
            pass

    start = time.perf_counter()
    joules = profiler._joules_per_pair(pair, coarse_counter_j, lambda: None, Module(), None, window_s)
    wall = time.perf_counter() - start
    assert len(calls) >= 2 and wall >= window_s
    expected = watts * wall / len(calls)
    assert joules == pytest.approx(expected, rel=step_s / window_s + 0.05)


@pytest.mark.parametrize("name, mem_gib, expected", [
    ("NVIDIA A100-SXM4-40GB", 40, "A100-40GB"), ("NVIDIA A100 80GB PCIe", 80, "A100-80GB"),
    ("Tesla V100-SXM2-16GB", 16, "V100-16GB"), ("Tesla V100-SXM2-32GB", 32, "V100-32GB"), ("Tesla T4", 15, "T4"),
    ("NVIDIA H100 80GB HBM3", 80, "H100-80GB"), ("NVIDIA GeForce RTX 3090", 24, "RTX3090"), ("NVIDIA A40", 48, "A40"),
])
def test_cuda_device_names_map_to_the_catalog(name, mem_gib, expected):
    assert catalog_gpu_name(name, mem_gib << 30) == expected


def test_uncatalogued_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match="not in the catalog"):
        catalog_gpu_name("NVIDIA L4", 24 << 30)


@pytest.mark.parametrize("args, fragment", [
    (["--tp", "3"], "tp=3 does not divide"),
    (["--mbs", "0"], "--mbs"),
    (["--mbs", "a"], "--mbs"),
    (["--repeats", "0"], "--repeats"),
    pytest.param(["--device", "cuda"], "cuda", marks=pytest.mark.skipif(torch.cuda.is_available(),
                                                                          reason="this machine has CUDA")),
    (["--dtype", "fp16"], "fp16"),
    (["--model", "no-such-model"], "unknown model"),
    # a layer-list YAML without a config: the trial worker cannot build it, so there is nothing to measure
    (["--model", "transgan"], "the trial worker cannot build it"),
    (["--model", "llama-tiny", "--tp", "3"], "tp=3 neither divides the 2 K/V heads"),
    (["--recompute", "none,partial"], "--recompute"),
])
def test_bad_arguments_are_one_line_errors(tmp_path, run_cli, args, fragment):
    base = {"--model": "gpt2-tiny", "--out": str(tmp_path / "p.csv")}
    for k, v in zip(args[::2], args[1::2], strict=False):
        base[k] = v
    argv = ["profile"] + [x for kv in base.items() for x in kv]
    code, _, err = run_cli(*argv)
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "p.csv").exists()
