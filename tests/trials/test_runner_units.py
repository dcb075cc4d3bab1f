"""Pure parts of the trial runner: plan validation, job files, trial keys, launch commands, hostfiles, outcomes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ampe.costmodel.cluster import cluster_from_dict
from ampe.errors import InputError
from ampe.formats.trial import TrialResult
from ampe.trials.commands import deepspeed_argv, worker_args
from ampe.trials.hostfile import UnrealizablePlacementError, host_layout
from ampe.trials.launch import build_launch, job_dict
from ampe.trials.outcome import classify
from ampe.trials.planfile import load_plan
from ampe.trials.prepare import prepare
from ampe.trials.runner import CostEstimator
from tests.support.trial_fixtures import four_strategies, options, strategy, write_plan

TWO_NODES = {"name": "two", "nodes": [{"name": "gpu", "gpu": "A100-40GB", "count": 2, "intra_gbps": 600,
                                       "inter_gbps": 100, "repeat": 2}]}

TORCHRUN_KILLED_LOG = """\
E1122 08:40:36.660000 4688 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
======================================================
fake_worker.py FAILED
------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-22_08:40:36
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 4693)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 4693
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_08:40:36
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 4694)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4694
======================================================
"""


def _edit(path: Path, fn) -> Path:
    raw = json.loads(path.read_text())
    fn(raw)
    path.write_text(json.dumps(raw))
    return path


@pytest.mark.parametrize("edit,field", [
    (lambda p: p["strategies"][1].pop("partition"), "strategies[1].partition"),
    (lambda p: p["strategies"][0]["predicted"].update(iteration_s=-1), "strategies[0].predicted.iteration_s"),
    (lambda p: p["strategies"][2].update(rank=1), "strategies[2].rank"),
    (lambda p: p["strategies"][0].update(gas=3), "strategies[0].gas"),
    (lambda p: p["strategies"][0].update(frequency_plan={"stages": [[["forward", 0, 1500]], [["sideways", 0, 1]]]}),
     "strategies[0].frequency_plan.stages[1][0][0]"),
    (lambda p: p["inputs"].update(model=3), "inputs.model"),
    (lambda p: p["strategies"][0]["predicted"].update(iteration_s=True), "strategies[0].predicted.iteration_s"),
    (lambda p: p.update(global_batch="eight"), "global_batch"),
    (lambda p: p.update(schema="ampe.plan/2"), "schema"),
])
def test_plan_validation_names_the_field(tmp_path, edit, field):
    path = _edit(write_plan(tmp_path, four_strategies()), edit)
    with pytest.raises(InputError) as e:
        load_plan(path)
    assert e.value.source == str(path) and e.value.field == field


def test_strategy_inconsistent_with_the_cluster_is_an_input_error(tmp_path):
    path = _edit(write_plan(tmp_path, four_strategies()), lambda p: p["strategies"][3].update(placement=[0, 0]))
    with pytest.raises(InputError) as e:
        prepare(path, options(tmp_path / "out"))
    assert e.value.field == "strategies[3].placement"


def test_plan_without_cluster_spec_needs_cluster_flag(tmp_path, run_cli):
    path = _edit(write_plan(tmp_path, four_strategies()), lambda p: p.pop("inputs"))
    code, _, err = run_cli("trial", "--plan", path, "--dry-run")
    assert code == 2 and "cluster_spec" in err and "--cluster" in err
    code, out, _ = run_cli("trial", "--plan", path, "--dry-run", "--cluster", tmp_path / "cluster.yaml")
    assert code == 0 and out.count("torch.distributed.run") == 4


def test_job_file_follows_the_contract_and_the_real_worker_accepts_it(tmp_path):
    ctx, trials, _ = prepare(write_plan(tmp_path, four_strategies()), options(tmp_path / "out"))
    job = job_dict(ctx, trials[0], tmp_path / "job")
    assert job["schema"] == "ampe.job/1" and job["model"] == "gpt2-tiny"
    assert job["strategy"] == {"pp": 2, "dp": 1, "tp": 1, "mbs": 1, "gbs": 8, "gas": 8, "partition": [0, 5, 10],
                               "placement": [0, 1], "schedule": "1f1b", "attention": "eager", "dtype": "fp32"}
    assert job["attention"] == "eager"  # the plan's kernel (gpt2-tiny: eager), handed to the worker
    assert job["gpu_types"] == ["cpu", "cpu"] and job["device"] == "cpu" and job["dtype"] == "fp32"
    assert (job["warmup_iters"], job["timed_iters"], job["freq_backend"]) == (1, 3, "none")
    worker = pytest.importorskip("ampe.runtime.worker")
    parsed = worker.parse_job(job, tmp_path / "job" / "job.json")
    assert parsed.strategy == job["strategy"] and parsed.device_local_index == [0, 1]
    assert parsed.to_json() == job  # the runner writes with the model the worker reads with


def test_trial_key_tracks_what_is_run_not_what_is_predicted(tmp_path):
    plan = write_plan(tmp_path, four_strategies())
    _, base, _ = prepare(plan, options(tmp_path / "out"))
    _, more_iters, _ = prepare(plan, options(tmp_path / "out", timed_iters=4))
    _edit(plan, lambda p: p["strategies"][0]["predicted"].update(iteration_s=9.0))
    _, repredicted, _ = prepare(plan, options(tmp_path / "out"))
    assert len({t.key for t in base}) == 4
    assert [t.key for t in repredicted] == [t.key for t in base]
    assert not {t.key for t in more_iters} & {t.key for t in base}
    assert all(t.trial_id.startswith(f"r{t.planned.rank:03d}-") for t in base)


def test_deepspeed_hostfile_matches_deepspeeds_own_parser():
    runner = pytest.importorskip("deepspeed.launcher.runner")
    cluster = cluster_from_dict(TWO_NODES)
    for placement in ([0, 1, 2, 3], [2, 3, 0, 1], [1, 0, 3, 2]):
        layout = host_layout(cluster, placement, {"gpu-0": "node-a", "gpu-1": "node-b"})
        pool = runner._parse_hostfile(layout.hostfile_text().splitlines())
        active = runner.parse_inclusion_exclusion(pool, layout.include(), "")
        # DeepSpeed numbers ranks host by host in this order; every rank must land on its placement's node.
        ds_hosts = [h for h, slots in active.items() for _ in slots]
        names = {"gpu-0": "node-a", "gpu-1": "node-b"}
        assert ds_hosts == [names[cluster.devices[d].node] for d in placement]
        assert layout.world_size == 4


def test_placement_interleaving_nodes_cannot_use_the_deepspeed_launcher():
    cluster = cluster_from_dict(TWO_NODES)
    with pytest.raises(UnrealizablePlacementError, match="not contiguous"):
        host_layout(cluster, [0, 2, 1, 3])


def test_multi_node_plan_launches_with_deepspeed_and_a_hostfile(tmp_path):
    spec = tmp_path / "two.yaml"
    spec.write_text(json.dumps(TWO_NODES))  # JSON is YAML
    plan = write_plan(tmp_path, [strategy(1, 4, 1, 1, 0.1), strategy(2, 2, 2, 1, 0.1)])
    _edit(plan, lambda p: p["inputs"].update(cluster_spec=str(spec)))
    _edit(plan, lambda p: p["strategies"][1].update(placement=[0, 2, 1, 3]))
    ctx, trials, _ = prepare(plan, options(tmp_path / "out", launcher="auto", worker="ampe.runtime.worker"))
    assert ctx.device == "cuda"
    launch = build_launch(ctx, trials[0], str(tmp_path / "job.json"))
    assert launch.kind == "deepspeed" and launch.hostfile == "gpu-0 slots=2\ngpu-1 slots=2\n"
    argv = list(launch.argv)
    assert argv[argv.index("--include") + 1] == "gpu-0:0,1@gpu-1:0,1"
    assert argv[-3:] == ["--module", "ampe.runtime.worker", str(tmp_path / "job.json")]
    with pytest.raises(UnrealizablePlacementError):
        build_launch(ctx, trials[1], str(tmp_path / "job.json"))
    with pytest.raises(InputError, match="CUDA"):
        prepare(plan, options(tmp_path / "out", memory_limit_bytes=1 << 30))


def test_worker_arguments_and_deepspeed_module_flag():
    assert worker_args("ampe.runtime.worker", "j.json") == ["-m", "ampe.runtime.worker", "j.json"]
    assert worker_args("w.py", "j.json", 1 << 30) == ["-m", "ampe.trials.limits", str(1 << 30), "w.py", "j.json"]
    layout = host_layout(cluster_from_dict(TWO_NODES), [0, 1, 2, 3])
    argv = deepspeed_argv("/h", layout, 29500, worker_args("ampe.runtime.worker", "j.json"))
    assert argv[-4:] == ["--no_local_rank", "--module", "ampe.runtime.worker", "j.json"]


def _job_dir(tmp_path: Path, **files: object) -> Path:
    d = tmp_path / "job"
    d.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (d / f"{name}.json").write_text(json.dumps(content))
    return d


def test_classify_reads_torchruns_root_cause(tmp_path):
    out = classify(_job_dir(tmp_path), [1], TORCHRUN_KILLED_LOG)
    assert (out.status, out.failed_rank) == ("killed", 1)
    assert "SIGKILL" in out.reason


def test_classify_blames_the_root_cause_not_torchruns_cleanup(tmp_path):
    crashed = TORCHRUN_KILLED_LOG.replace("exitcode  : -9 (pid: 4694)  (SIGKILL)", "exitcode  : 1 (pid: 4694)")
    d = _job_dir(tmp_path, error_rank1={"kind": "crash", "message": "ValueError: bad layer"})
    out = classify(d, [1], crashed)  # rank 0's SIGTERM in "Failures" is torchrun stopping it
    assert (out.status, out.failed_rank) == ("crash", 1) and "bad layer" in out.reason


def test_classify_prefers_oom_over_its_consequences(tmp_path):
    d = _job_dir(tmp_path, error_rank1={"kind": "oom", "message": "CUDA out of memory"},
                 error_rank0={"kind": "crash", "message": "Connection closed by peer"})
    out = classify(d, [1], TORCHRUN_KILLED_LOG)
    assert (out.status, out.failed_rank) == ("oom", 1)
    # a crash whose message says out of memory is an OOM too
    d2 = _job_dir(tmp_path / "b", error_rank0={"kind": "crash", "message": "RuntimeError: std::bad_alloc"})
    assert classify(d2, [1], "").status == "oom"


def test_thread_creation_failure_is_oom_only_under_a_memory_limit(tmp_path):
    d = _job_dir(tmp_path, error_rank0={"kind": "crash", "message": "RuntimeError: Resource temporarily unavailable"})
    assert classify(d, [1], "").status == "crash"
    out = classify(d, [1], "", memory_limited=True)
    assert out.status == "oom" and "--memory-limit" in out.reason


def test_classify_timeout_ignores_the_runners_own_signals(tmp_path):
    d = _job_dir(tmp_path, progress={"iteration": 3, "of": 10})
    out = classify(d, [None, None], "", timed_out=True, local_ranks=True)
    assert out.status == "timeout" and "iteration 3 of 10" in out.reason
    out = classify(d, [-9, None], "", timed_out=True, local_ranks=True)  # rank 0 died before the runner acted
    assert (out.status, out.failed_rank) == ("killed", 0)


def test_classify_ok_needs_every_exit_zero_and_iteration_times(tmp_path):
    good = {"status": "ok", "iteration_s": [0.1, 0.3], "peak_memory_bytes_per_rank": [5, 7],
            "energy_j_per_iter": 2.0, "energy_source": "nvml", "ranks": [{"rank": 0, "big": "x" * 100}]}
    out = classify(_job_dir(tmp_path, result=good), [0], "")
    assert out.status == "ok"
    m = out.measured
    assert m["iteration_s_mean"] == pytest.approx(0.2) and m["iteration_s_std"] == pytest.approx(0.1)
    assert m["peak_memory_bytes_per_rank"] == (5, 7) and m["energy_source"] == "nvml"
    assert "ranks" not in m["worker"]  # the bulky per-rank reports stay in the job folder
    assert classify(_job_dir(tmp_path, result=good), [1], "boom").status == "crash"


def test_cost_estimator_learns_startup_and_bias():
    est = CostEstimator(startup_s=30.0)
    assert est.expected_s(0.5, 10) == pytest.approx(35.0)
    for pred, meas, wall in ((0.5, 1.0, 14.0), (0.2, 0.4, 8.0)):
        est.observe(TrialResult(key="k", trial_id="t", plan_rank=1, strategy={}, model="m", cluster="c",
                                freq_backend="none", schedule_applied=False, warmup_iters=2, timed_iters=8,
                                status="ok", predicted_iteration_s=pred, iteration_s_mean=meas, wall_s=wall))
    # startups: 14 − 10·1.0 = 4 and 8 − 10·0.4 = 4; measured/predicted = 2 both times
    assert est.expected_s(0.5, 10) == pytest.approx(4.0 + 10 * 0.5 * 2.0)


@pytest.mark.parametrize("text,expected", [("512M", 512 << 20), ("6G", 6 << 30), ("1.5GiB", 3 << 29),
                                           ("2097152", 2 << 20)])
def test_memory_limit_sizes(text, expected):
    from ampe.cli.trial import _size

    assert _size(text) == expected


def test_bad_memory_limit_is_exit_2(tmp_path, run_cli):
    code, _, err = run_cli("trial", "--plan", write_plan(tmp_path, four_strategies()), "--memory-limit", "lots")
    assert code == 2 and "--memory-limit" in err


def test_schedules_stock_deepspeed_cannot_run_are_skipped_with_the_reason(tmp_path):
    """GPipe and interleaved plans are costed but never launched: DeepSpeed would run its 1F1B schedule instead."""
    entries = four_strategies()
    entries[0]["schedule"] = "gpipe"
    plan = load_plan(write_plan(tmp_path, entries))
    _, trials, left_out = prepare(plan, options(tmp_path / "out", top_k=2))
    assert [t.strategy.schedule for t in trials] == ["1f1b", "1f1b"]
    assert len(left_out) == 1 and left_out[0].status == "skipped"
    assert "not runnable by ampe's worker" in left_out[0].reason and "1F1B" in left_out[0].reason


def test_job_strategy_carries_memory_options_only_when_used():
    from ampe.costmodel.strategy import Strategy

    plain = Strategy(2, 1, 1, 2, 8, partition=(0, 4, 10), placement=(0, 1)).to_dict()
    assert "recompute" not in plain and "zero" not in plain  # the trial keys of earlier results stay the same
    used = Strategy(1, 2, 1, 2, 8, partition=(0, 10), placement=(0, 1), recompute="full", zero=1).to_dict()
    assert used["recompute"] == "full" and used["zero"] == 1
