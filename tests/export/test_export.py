"""``ampe export`` without launching anything: the files, the rank → host map against DeepSpeed's own launcher code,
the refusals, and the runtime's pure helpers (measurements lines, GPU index, host matching)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from ampe import jitops
from ampe.formats.export import ExportFile
from ampe.formats.job import JobFile
from ampe.formats.plan import load_plan_file
from ampe.runtime.placement import same_host, visible_gpu_index
from tests.export.support import HOSTS, ampe, pick, two_host_plan


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    return two_host_plan(tmp_path_factory.mktemp("plan"))


def test_no_script_and_no_train_py_here_is_refused_in_one_line_naming_script(plan, tmp_path, monkeypatch, run_cli):
    monkeypatch.chdir(tmp_path)
    argv = ("export", "--plan", plan, "--out", tmp_path / "exp", "--host-map", plan.parent / "hosts.yaml")
    code, _, err = run_cli(*argv)  # not tests.export.support.ampe, which names a script
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "ampe export: " in err and "--script" in err and "train.py" in err and not (tmp_path / "exp").exists()
    (tmp_path / "train.py").write_text("print('training')\n")  # the default, once it is there, is taken
    code, _, err = run_cli(*argv)
    assert code == 0, err
    assert str(tmp_path / "train.py") in (tmp_path / "exp" / "launch.sh").read_text()


def test_multi_host_export_writes_every_file_consistently(plan, tmp_path):
    rank = pick(plan, frequency_plan=True)
    out = tmp_path / "exp"
    code, stdout, err = ampe("export", "--plan", plan, "--rank", rank, "--out", out, "--host-map",
                             plan.parent / "hosts.yaml", "--script", "my_train.py", "--master-port", "29555")
    assert code == 0, err
    assert "launcher deepspeed, master localhost:29555" in stdout
    for name in ("export.json", "ds_config.json", "frequency_plan.json", "hostfile", ".deepspeed_env", "launch.sh",
                 "launch_worker.sh", "worker/job.json", "commands.json", "README.md"):
        assert (out / name).is_file(), name
    e = ExportFile.parse(json.loads((out / "export.json").read_text()), "export.json")
    entry = next(s for s in load_plan_file(plan).strategies if s.rank == rank)
    assert e.parts == entry.partition and e.strategy["placement"] == entry.placement
    assert e.launcher == "deepspeed" and e.master_addr == "localhost" and e.master_port == 29555
    # rank r → the device the placement names → its node → the mapped host
    assert [(r.rank, r.stage, r.node, r.host) for r in e.ranks] == [(0, 0, "n-0", "localhost"),
                                                                    (1, 1, "n-1", "127.0.0.2")]
    assert (out / "hostfile").read_text() == "localhost slots=1\n127.0.0.2 slots=1\n"
    ds = json.loads((out / "ds_config.json").read_text())
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == \
        (entry.gbs, entry.mbs, entry.gas)
    assert ds["optimizer"]["params"]["torch_adam"] is True  # CPU: no fused CUDA Adam
    fp = json.loads((out / "frequency_plan.json").read_text())
    assert fp["stages"] == entry.frequency_plan.model_dump(mode="json")["stages"]
    assert fp["gpu_types"] == ["cpu", "cpu"]
    assert e.freq_backend == "emulate"  # CPU with clocks: what `ampe trial` would use
    # DeepSpeed splits every line of .deepspeed_env at "=": nothing else may be in it.
    env_lines = (out / ".deepspeed_env").read_text().splitlines()
    assert all("=" in line and not line.startswith("#") for line in env_lines)
    assert f"AMPE_EXPORT={out / 'export.json'}" in env_lines and "DS_ACCELERATOR=cpu" in env_lines
    job = JobFile.parse(json.loads((out / "worker/job.json").read_text()), "job.json")
    assert job.strategy["partition"] == e.parts and job.freq_backend == "emulate"
    assert job.out_dir == str(out / "worker")
    cmds = json.loads((out / "commands.json").read_text())
    assert cmds["user"][-1] == str(Path("my_train.py").resolve())  # launch.sh changes folder: absolute
    assert cmds["worker"][-3:] == ["--module", "ampe.runtime.worker", str(out / "worker" / "job.json")]
    launch = (out / "launch.sh").read_text()
    assert shlex.join(cmds["user"]) + ' "$@"' in launch
    # DeepSpeed's CPU op: built once before any rank starts, in the folder every host's ranks get
    extensions = str(jitops.extensions_dir().path)
    assert f"TORCH_EXTENSIONS_DIR={extensions}" in env_lines and cmds["env"]["TORCH_EXTENSIONS_DIR"] == extensions
    assert cmds["prebuild"] == [sys.executable, "-m", "ampe.runtime.prebuild"]
    for script in ("launch.sh", "launch_worker.sh"):
        text = (out / script).read_text()
        steps = [line for line in text.splitlines() if line and not line.startswith("#")]
        assert steps.index(shlex.join(cmds["prebuild"])) == len(steps) - 2  # right before the launch
        assert f"export TORCH_EXTENSIONS_DIR={shlex.quote(extensions)}" in steps
        assert steps[-1].startswith("exec ")
    readme = (out / "README.md").read_text()
    assert "| 1 | 1 | 0 | 0 | 127.0.0.2 | n-1 | 0 | cpu |" in readme and "load_export()" in readme


def test_exported_launch_puts_every_rank_on_its_planned_host_per_deepspeeds_launcher(plan, tmp_path):
    runner = pytest.importorskip("deepspeed.launcher.runner")
    out = tmp_path / "exp"
    code, _, err = ampe("export", "--plan", plan, "--rank", pick(plan), "--out", out, "--host-map",
                        plan.parent / "hosts.yaml")
    assert code == 0, err
    e = ExportFile.parse(json.loads((out / "export.json").read_text()), "export.json")
    argv = json.loads((out / "commands.json").read_text())["user"]
    args = runner.parse_args(argv[argv.index("deepspeed.launcher.runner") + 1:])
    pool = runner.fetch_hostfile(args.hostfile)
    active = runner.parse_inclusion_exclusion(pool, args.include, args.exclude)
    ds_hosts = [h for h, slots in active.items() for _ in slots]  # DeepSpeed numbers ranks host by host
    assert ds_hosts == [r.host for r in e.ranks]
    assert args.master_addr == ds_hosts[0] == e.master_addr and args.no_local_rank


def test_single_host_export_uses_torchrun(tmp_path):
    from conftest import SPECS

    plan = tmp_path / "plan.json"
    from tests.export.support import MLP

    code, _, err = ampe("search", "--cluster", SPECS / "local-cpu.yaml", "--model", MLP, "--global-batch", "8",
                        "--pp", "2", "--top-k", "2", "--out", plan)
    assert code == 0, err
    code, _, err = ampe("export", "--plan", plan, "--out", tmp_path / "exp", "--script", "pkg.train")
    assert code == 0, err
    cmds = json.loads((tmp_path / "exp" / "commands.json").read_text())
    assert cmds["launcher"] == "torchrun"
    assert cmds["user"][-5:] == ["--standalone", "--nproc_per_node", "2", "-m", "pkg.train"]


@pytest.mark.parametrize("argv, needle", [
    (["--rank", "99"], "--rank: "),
    (["--launcher", "torchrun"], "torchrun runs one host"),
    (["--script", "rm -rf /"], "--script: "),
])
def test_bad_export_requests_are_one_line_exit_2(plan, tmp_path, argv, needle):
    code, _, err = ampe("export", "--plan", plan, "--out", tmp_path / "x", "--host-map", plan.parent / "hosts.yaml",
                        *argv)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_unlaunchable_placement_and_bad_host_map_are_refused(plan, tmp_path):
    bad_map = tmp_path / "hosts.yaml"
    bad_map.write_text("n-0: 'no such host!'\n")
    code, _, err = ampe("export", "--plan", plan, "--out", tmp_path / "x", "--host-map", bad_map)
    assert code == 2 and "placement" in err and "plain host name" in err
    bad_map.write_text("- a\n")
    code, _, err = ampe("export", "--plan", plan, "--out", tmp_path / "x", "--host-map", bad_map)
    assert code == 2 and "must map cluster node names" in err


def test_measurement_lines_take_the_slowest_rank_and_sum_energy():
    from ampe.runtime.user import measurement_lines

    s = {"pp": 2, "dp": 1, "tp": 1, "mbs": 1, "gbs": 2, "partition": [0, 1, 2], "placement": [0, 1],
         "schedule": "1f1b"}
    ranks = [{"iteration_s": [1.0, 3.0], "energy_j": [10.0, 20.0], "peak_memory_bytes": 5},
             {"iteration_s": [2.0, 1.0, 9.0], "energy_j": [1.0, 2.0, 3.0], "peak_memory_bytes": 7}]
    [run] = measurement_lines(s, ranks)
    assert run == {"strategy": s, "iteration_s": 2.5, "status": "ok", "peak_memory_bytes": 7, "energy_j": 16.5}
    per = measurement_lines(s, ranks, per="iteration")
    assert [(x["iteration_s"], x["energy_j"]) for x in per] == [(2.0, 11.0), (3.0, 22.0)]
    ranks[0]["peak_memory_bytes"] = None
    ranks[1]["energy_j"] = []
    [bare] = measurement_lines(s, ranks)
    assert set(bare) == {"strategy", "iteration_s", "status"}
    assert measurement_lines(s, [{"iteration_s": [], "energy_j": [], "peak_memory_bytes": 1}]) == \
        [{"strategy": s, "iteration_s": None, "status": "failed"}]


def test_gpu_index_follows_the_launchers_visible_devices():
    assert visible_gpu_index(3, {}) == 3
    assert visible_gpu_index(3, {"CUDA_VISIBLE_DEVICES": "1,3"}) == 1  # --include host:1,3 renumbers from 0
    assert visible_gpu_index(0, {"CUDA_VISIBLE_DEVICES": "0,1"}) == 0
    assert visible_gpu_index(2, {"CUDA_VISIBLE_DEVICES": "0,1"}) == 2  # not listed: taken as already relative


def test_host_matching():
    assert same_host("node1", "node1.cluster") and same_host("localhost", "localhost")
    assert same_host("127.0.0.1", "localhost")  # an address names the host it resolves to
    assert not same_host("127.0.0.2", "localhost") and not same_host("127.0.0.1", "127.0.0.2")
    assert not same_host("no-such-host-ampe.invalid", "localhost")
    assert HOSTS["n-0"] != HOSTS["n-1"]


@pytest.fixture
def exported(plan, tmp_path):
    code, _, err = ampe("export", "--plan", plan, "--out", tmp_path / "exp", "--host-map", plan.parent / "hosts.yaml")
    assert code == 0, err
    return tmp_path / "exp" / "export.json"


def test_recorder_skips_warm_up_and_writes_one_line_per_run(exported, tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from ampe.runtime import load_export

    monkeypatch.setenv("AMPE_EXPORT", str(exported))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("RANK", "1")
    plan = load_export()
    assert plan.place.host == "127.0.0.2" and plan.dist_backend == "gloo"
    out = tmp_path / "m.jsonl"
    calls = []

    def iteration():
        calls.append(torch.ones(1000).sum())  # 4000 bytes live during the traced warm-up

    with plan.recorder(path=out, warmup=2) as rec:
        for _ in range(5):
            rec.step(iteration)
    assert len(calls) == 5 and len(rec.iteration_s) == 3  # warm-up not timed
    [line] = [json.loads(x) for x in out.read_text().splitlines()]
    assert line["status"] == "ok" and line["iteration_s"] == pytest.approx(sum(rec.iteration_s) / 3)
    assert line["peak_memory_bytes"] >= 4000 and "energy_j" not in line  # no hook: no energy figure
    assert line["strategy"] == {**{k: plan.strategy[k] for k in ("pp", "dp", "tp", "mbs", "gbs", "partition",
                                                                 "placement", "schedule", "attention", "dtype",
                                                                 "tf32")},
                                "recompute": "none", "zero": 0}  # how it ran, the defaults written out
    assert (line["strategy"]["attention"], line["strategy"]["dtype"]) == ("eager", "fp32")
    assert plan.strategy["tf32"] is False and line["strategy"]["tf32"] is False  # the plan's, and the flag that ran


def test_the_exported_tf32_setting_is_set_and_recorded_as_it_ran(exported, monkeypatch):
    """The export names TF32 (off: the search's default), which select_device applies through apply_tf32 (not
    called here: on a CPU it pins the test process to a core); the measurement line records the flag in force (a
    script that turned it on afterwards: what ran, not what was planned)."""
    torch = pytest.importorskip("torch")
    from ampe.runtime import load_export
    from ampe.runtime.precision import apply_tf32

    monkeypatch.setenv("AMPE_EXPORT", str(exported))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("RANK", "0")
    plan = load_export()
    before = apply_tf32(torch, None)
    try:
        assert apply_tf32(torch, plan.strategy["tf32"]) == {"matmul": False, "cudnn": False}
        assert plan.measurement_strategy()["tf32"] is False
        torch.backends.cuda.matmul.allow_tf32 = True
        assert plan.measurement_strategy()["tf32"] is True
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before["matmul"]
        torch.backends.cudnn.allow_tf32 = before["cudnn"]


def test_recorder_writes_the_failure_and_reraises(exported, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from ampe.runtime import load_export

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    plan = load_export(exported, rank=0)
    out = tmp_path / "m.jsonl"
    with pytest.raises(MemoryError), plan.recorder(path=out, warmup=0) as rec:
        rec.step(lambda: None)
        raise MemoryError
    with pytest.raises(ValueError, match="boom"), plan.recorder(path=out, warmup=0):
        raise ValueError("boom")
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(x["status"], x["iteration_s"]) for x in lines] == [("oom", None), ("failed", None)]


def test_load_export_refuses_what_does_not_fit(exported, monkeypatch):
    from ampe.runtime import load_export

    monkeypatch.delenv("AMPE_EXPORT", raising=False)
    with pytest.raises(RuntimeError, match="AMPE_EXPORT"):
        load_export()
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(RuntimeError, match="WORLD_SIZE=4"):
        load_export(exported, rank=0)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="rank 2"):
        load_export(exported, rank=2)
    raw = json.loads(exported.read_text())
    raw["parts"] = [0, 6]
    exported.write_text(json.dumps(raw))
    from ampe.errors import InputError

    with pytest.raises(InputError, match="parts"):
        load_export(exported, rank=0)


def test_pipeline_module_recomputes_where_the_plans_stage_says_so(exported, monkeypatch, capsys):
    """Per-stage recomputation reaches the user's PipelineModule: a ``full`` stage checkpoints every layer (unless the
    script chose an interval), a ``none`` stage does not, and ``selective`` warns (it lives in the user's layers)."""
    pytest.importorskip("deepspeed")
    from ampe.runtime import load_export, pipeline

    raw = json.loads(exported.read_text())
    pp = raw["strategy"]["pp"]
    assert pp >= 2
    raw["strategy"].update(recompute="full", stage_recompute=["full"] + ["selective"] + ["none"] * (pp - 2))
    exported.write_text(json.dumps(raw))
    seen = []

    class Built:  # a built PipelineModule of user layers: no ampe block to make selective
        def __init__(self, parts, stage):
            self._local_start, self._local_stop = parts[stage], parts[stage + 1]

        def modules(self):
            return iter(())

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for rank in range(len(raw["ranks"])):
        plan = load_export(exported, rank=rank)
        stage = plan.place.stage

        def build(specs, parts, topo, stage=stage, **kw):
            seen.append((stage, kw))
            return Built(parts, stage)

        monkeypatch.setattr(pipeline, "explicit_pipeline_module", build)
        plan.pipeline_module([object()] * plan.parts[-1], loss_fn=None)
    by_stage = {stage: kw for stage, kw in seen}
    assert by_stage[0].get("activation_checkpoint_interval") == 1
    assert "activation_checkpoint_interval" not in by_stage[1]
    assert "selective recomputation on stage 1" in capsys.readouterr().err
    if pp > 2:
        assert "activation_checkpoint_interval" not in by_stage[2]
    plan = load_export(exported, rank=0)
    monkeypatch.setattr(pipeline, "explicit_pipeline_module",
                        lambda specs, parts, topo, **kw: seen.append((0, kw)) or Built(parts, 0))
    plan.pipeline_module([object()] * plan.parts[-1], activation_checkpoint_interval=4)
    assert seen[-1][1]["activation_checkpoint_interval"] == 4  # the script's choice wins


LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
                "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 4,
                "vocab_size": 1000, "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "torch_dtype": "float32"}


def test_readme_gives_the_layer_layout_the_plans_prediction_and_a_report_command_that_runs_anywhere(
        tmp_path, monkeypatch):
    """A user's Hugging Face config named relatively (`--model config.json`, no folder): the README lists the Llama
    layout (L + 4 entries) and each stage's layers, predicts with the frequency plan beside all-max, and its closing
    `ampe report` command works from another folder."""
    from ampe.units import si

    work = tmp_path / "work"
    work.mkdir()
    (work / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    (work / "cluster.yaml").write_text((Path(__file__).resolve().parents[2] / "cluster_specs" / "local-cpu.yaml")
                                      .read_text())
    monkeypatch.chdir(work)
    code, _, err = ampe("search", "--cluster", "cluster.yaml", "--model", "config.json", "--global-batch", "8",
                        "--pp", "2", "--top-k", "2", "--out", "plan.json")
    assert code == 0, err
    code, _, err = ampe("export", "--plan", "plan.json", "--out", "exp")
    assert code == 0, err
    readme = (work / "exp" / "README.md").read_text()
    e = ExportFile.parse(json.loads((work / "exp" / "export.json").read_text()), "export.json")
    assert "8 entries: 0 embedding | 1..4 transformer | 5 norm | 6 logits | 7 noop" in readme
    b = e.parts[1]
    assert f"stage 0: layers 0..{b - 1} = embedding, transformer ×{b - 1}" in readme
    assert f"stage 1: layers {b}..7 = transformer ×{5 - b}, norm, logits, noop" in readme
    entry = next(s for s in load_plan_file(work / "plan.json").strategies if s.rank == 1)
    fp = entry.frequency_plan
    assert fp is not None and fp.energy_j < fp.energy_max_clock_j
    assert f"with the frequency plan: {fp.time_s:.4g} s, {si(fp.energy_j, 'J')}" in readme
    assert f"with every clock at its maximum: {entry.predicted.max_clock_time_s:.4g} s, " \
           f"{si(entry.predicted.energy_max_clock_j, 'J')}" in readme
    command = next(ln for ln in readme.splitlines() if ln.startswith("ampe report --measurements"))
    argv = shlex.split(command)
    for flag in ("--measurements", "--cluster", "--model"):
        assert Path(argv[argv.index(flag) + 1]).is_absolute(), command
    # the recorder's line, then the command from another folder
    s = entry
    Path(e.measurements).write_text(json.dumps({
        "strategy": {"pp": s.pp, "dp": s.dp, "tp": s.tp, "mbs": s.mbs, "gbs": s.gbs, "partition": list(s.partition)},
        "iteration_s": 0.2, "status": "ok", "energy_j": 3.0, "energy_source": "modelled"}) + "\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, out, err = ampe(*argv[1:])
    assert code == 0, err
    assert "3 J" in out and "modelled" in out and "measured)" not in out  # the line's own energy label
