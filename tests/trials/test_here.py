"""``ampe trial`` of a plan made for a GPU cluster, on a machine without its hosts or GPUs: refused before any rank
starts, in one line saying what to pass (ampe.trials.here); and the options that map it onto this machine's CPU
(``--cluster cluster_specs/local-cpu-16.yaml --model gpt2-amp-mini``, README) give a runnable CPU trial."""

from __future__ import annotations

import pytest

from ampe.errors import InputError
from ampe.trials import here
from ampe.trials.prepare import TrialOptions, prepare
from tests.conftest import AMP_PROFILE, SPECS


@pytest.fixture(scope="module")
def demo_plan(tmp_path_factory):
    from ampe.cli import main

    out = tmp_path_factory.mktemp("demo") / "demo-plan.json"
    assert main(["search", "--cluster", str(SPECS / "amp-het-cluster.yaml"), "--model", "gpt2-amp", "--profile",
                 str(AMP_PROFILE), "--global-batch", "32", "--top-k", "1", "--out", str(out)]) == 0
    return out


def _check(plan, tmp_path, gpus: int, **options) -> None:
    ctx, trials, _ = prepare(plan, TrialOptions(out_dir=tmp_path / "runs", top_k=1, **options))
    here.check_here(ctx, trials, gpus=gpus)


def test_the_demo_plan_on_a_machine_without_its_hosts_or_gpus_names_what_to_pass(demo_plan, tmp_path, run_cli):
    code, _, err = run_cli("trial", "--plan", demo_plan, "--top-k", "1", "--out", tmp_path / "runs")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("ampe trial: error: --host-map: ") and "p3-0" in err and "--launcher torchrun" in err
    assert not (tmp_path / "runs").exists()  # refused before any folder is claimed or rank started
    with pytest.raises(InputError, match=r"puts 16 GPU rank.* which has 0 GPU.*--cluster") as e:
        _check(demo_plan, tmp_path, gpus=0, launcher="torchrun")
    assert e.value.source == "--cluster"
    nodes = {"p3-0", "p3-1", "p3-2", "p3-3", "g4-0", "g4-1", "g4-2", "g4-3"}
    with pytest.raises(InputError, match="puts 16 GPU rank"):  # every node mapped to this machine: its GPUs count
        _check(demo_plan, tmp_path, gpus=8, host_map={n: "localhost" for n in nodes})
    _check(demo_plan, tmp_path, gpus=16, host_map={n: "localhost" for n in nodes})
    _check(demo_plan, tmp_path, gpus=16, launcher="torchrun")


def test_nvml_without_a_gpu_is_refused_and_emulate_is_not(demo_plan, tmp_path):
    cpu = dict(cluster_spec=str(SPECS / "local-cpu-16.yaml"), model="gpt2-amp-mini")
    with pytest.raises(InputError, match=r"nvml sets GPU clocks.*(use emulate|pass --freq-backend emulate)") as e:
        _check(demo_plan, tmp_path, gpus=0, freq_backend="nvml", **cpu)
    assert e.value.source == "--freq-backend"
    _check(demo_plan, tmp_path, gpus=0, freq_backend="emulate", **cpu)


def test_the_readme_options_map_the_demo_plan_onto_this_machines_cpu(demo_plan, tmp_path):
    options = TrialOptions(out_dir=tmp_path / "runs", top_k=1, cluster_spec=str(SPECS / "local-cpu-16.yaml"),
                           model="gpt2-amp-mini", freq_backend="none")
    ctx, trials, left_out = prepare(demo_plan, options)
    here.check_here(ctx, trials, gpus=0)
    assert ctx.device == "cpu" and ctx.dtype == "fp32" and not left_out and len(trials) == 1
    t = trials[0]
    top = ctx.plan.strategies[0]
    assert (t.strategy.pp, t.strategy.dp, t.strategy.tp) == (top.strategy.pp, top.strategy.dp, top.strategy.tp)
    assert ctx.plan.model == "gpt2-amp-mini" and ctx.plan.profile is None
    # predicted for what runs (the mini model on 16 time-shared CPU ranks), not the plan's V100/T4 figure
    assert t.predicted_s != top.predicted.iteration_s and t.predicted_s > 0


def test_a_model_with_other_layers_than_the_plans_is_refused(demo_plan, tmp_path):
    with pytest.raises(InputError, match="gpt2-tiny has 10 layers and the plan's gpt2-amp 30") as e:
        prepare(demo_plan, TrialOptions(out_dir=tmp_path / "runs", model="gpt2-tiny",
                                        cluster_spec=str(SPECS / "local-cpu-16.yaml")))
    assert e.value.source == "--model"


def test_gpus_here_reads_the_driver_the_device_files_and_cuda_visible_devices(tmp_path):
    proc, dev = tmp_path / "gpus", tmp_path / "dev"
    assert here.gpus_here(proc, dev, {}) == 0  # no driver
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (dev / name).touch()
    assert here.gpus_here(proc, dev, {}) == 2  # a container without /proc/driver/nvidia
    proc.mkdir()
    for bus in ("0000:17:00.0", "0000:65:00.0", "0000:ca:00.0"):
        (proc / bus).mkdir()
    assert here.gpus_here(proc, dev, {}) == 3
    assert here.gpus_here(proc, dev, {"CUDA_VISIBLE_DEVICES": "1"}) == 1
    assert here.gpus_here(proc, dev, {"CUDA_VISIBLE_DEVICES": ""}) == 0


def test_a_model_instead_drops_the_plans_clocks_and_emulated_speed_is_cpu_only(demo_plan, tmp_path):
    """--model on the plan's own cluster: the clocks were planned for the plan's model, so none are carried (the
    trial is predicted and run without them); --emulate-speed on GPU devices is refused in one line."""
    _, trials, _ = prepare(demo_plan, TrialOptions(out_dir=tmp_path / "runs", top_k=1, model="gpt2-amp-mini"))
    assert trials and all(t.backend == "none" for t in trials)
    with pytest.raises(InputError) as e:
        prepare(demo_plan, TrialOptions(out_dir=tmp_path / "runs", top_k=1, emulate_speed=True))
    assert e.value.source == "--emulate-speed"
