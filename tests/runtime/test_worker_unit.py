"""Worker pieces that need no processes: job parsing, rank coordinates vs DeepSpeed's topology, error
classification and files, result aggregation, the GPT layer list, memory probes."""

from __future__ import annotations

import json

import pytest
import torch

from ampe.costmodel.strategy import Strategy, complete
from ampe.costmodel.zoo import load_model
from ampe.errors import InputError
from ampe.measure.memory_probe import CpuAllocationTrace, SavedActivations
from ampe.runtime import worker
from ampe.runtime.aggregate import MODELLED
from ampe.runtime.gpt_pipe import build_layer, check_gpt_layout, layer_specs
from ampe.runtime.tensor_parallel import TpGroup


def job_dict(tmp_path, **kw):
    d = {"schema": "ampe.job/1", "trial_id": "t", "model": "gpt2-tiny",
         "strategy": {"pp": 2, "dp": 1, "tp": 1, "mbs": 2, "gbs": 8, "partition": [0, 4, 10]},
         "gpu_types": ["cpu", "cpu"], "device": "cpu", "dtype": "fp32", "out_dir": str(tmp_path)}
    d.update(kw)
    return d


def test_parse_job_defaults_and_errors(tmp_path):
    job = worker.parse_job(job_dict(tmp_path), tmp_path / "job.json")
    assert (job.warmup_iters, job.timed_iters, job.freq_backend, job.frozen_layers) == (2, 8, "none", 0)
    for bad, field in (({"dtype": "fp16"}, "dtype"), ({"device": "tpu"}, "device"), ({"timed_iters": 0}, "timed_iters"),
                       ({"frequency_plan": [1]}, "frequency_plan"), ({"schema": "x/2"}, "schema"),
                       ({"gpu_types": "cpu"}, "gpu_types"), ({"dropout": 1.0}, "dropout"),
                       ({"timed_iters": True}, "timed_iters"), ({"dropout": float("nan")}, "dropout"),
                       ({"frequency_plan": {"stages": [[["forward", 0, 10 ** 9]]]}}, "frequency_plan.stages[0][0][2]")):
        with pytest.raises(InputError) as e:
            worker.parse_job(job_dict(tmp_path, **bad), tmp_path / "job.json")
        assert e.value.field == field and e.value.source.endswith("job.json")


def test_rank_coordinates_match_deepspeed_topology():
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    for pp, dp, tp in ((2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 2), (3, 2, 2)):
        s = complete(Strategy(pp, dp, tp, 1, dp * 4), 10)
        s = Strategy(pp, dp, tp, 1, dp * 4, s.partition, tuple(reversed(s.placement)))
        topo = PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)
        for rank in range(s.world_size):
            c = worker.coordinates(s, rank)
            ds = topo.get_coord(rank)
            assert (c.stage, c.replica, c.shard) == (ds.pipe, ds.data, ds.model)
            assert c.device == s.placement[rank] == s.world_size - 1 - rank


def test_classify_error():
    assert worker.classify_error(MemoryError()) == "oom"
    assert worker.classify_error(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried 10 GB")) == "oom"
    assert worker.classify_error(RuntimeError("CUDA out of memory. Tried to allocate")) == "oom"
    assert worker.classify_error(torch.cuda.OutOfMemoryError("x")) == "oom"
    assert worker.classify_error(ValueError("memory")) == "crash"
    assert worker.classify_error(RuntimeError("NCCL timeout")) == "crash"


def test_bad_job_writes_an_error_file_and_exits_nonzero(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    job = job_dict(tmp_path, strategy={"pp": 2, "dp": 1, "tp": 1, "mbs": 2, "gbs": 8, "partition": [0, 4, 9]})
    (tmp_path / "job.json").write_text(json.dumps(job))
    assert worker.main([str(tmp_path / "job.json")]) == 1
    err = json.loads((tmp_path / "error_rank1.json").read_text())
    assert err["kind"] == "crash" and "partition" in err["message"]
    assert not (tmp_path / "result.json").exists()
    (tmp_path / "job.json").write_text("{not json")
    assert worker.main([str(tmp_path / "job.json")]) == 1
    assert worker.main([]) == 2


def test_aggregate_takes_the_slowest_rank_per_iteration(tmp_path):
    job = worker.parse_job(job_dict(tmp_path, frequency_plan={"stages": [[], []]}), tmp_path / "job.json")

    def rank(r, times, energy, ok=True):
        return {"rank": r, "iteration_s": times, "peak_memory_bytes": 100 + r, "memory_source": "cpu_alloc_trace",
                "energy_j": energy, "energy_source": "modelled", "instructions_ok": ok,
                "instruction_mismatch": None if ok else "stage 1: x", "freq_backend": "emulate", "loss": [2.0, 1.0],
                "startup_s": 3.0 + r, "plan_applied": ok}

    res = worker.aggregate(job, [rank(0, [1.0, 3.0], 2.0), rank(1, [2.0, 1.0], 5.0)], 9.0)
    assert res["iteration_s"] == [2.0, 3.0] and res["iteration_s_mean"] == 2.5 and res["iteration_s_std"] == 0.5
    assert res["energy_j_per_iter"] == 7.0 and res["energy_source"] == MODELLED
    assert res["plan_applied"] and res["peak_memory_bytes_per_rank"] == [100, 101] and res["startup_s"] == 4.0
    res = worker.aggregate(job, [rank(0, [1.0], None), rank(1, [1.0], 1.0, ok=False)], 1.0)
    assert res["energy_j_per_iter"] is None and not res["plan_applied"]
    assert res["instruction_mismatches"] == ["stage 1: x"]


def test_aggregate_gives_each_replica_its_share_and_the_latest_own_time_of_its_ranks(tmp_path):
    job = worker.parse_job(job_dict(tmp_path), tmp_path / "job.json")
    base = {"peak_memory_bytes": 1, "memory_source": "x", "energy_j": None, "energy_source": None,
            "instructions_ok": True, "instruction_mismatch": None, "freq_backend": "none", "loss": [1.0],
            "startup_s": 1.0}
    # pp 2 × dp 2: ranks (stage, replica) = (0,0) (0,1) (1,0) (1,1); replica 0 runs 3 micro-batches, replica 1 one
    ranks = [{**base, "rank": r, "replica": r % 2, "share": (3, 1)[r % 2], "iteration_s": [2.0, 2.0],
              "own_s": own} for r, own in enumerate([[1.5, 1.6], [0.4, None], [1.9, 1.2], [0.6, 0.5]])]
    res = worker.aggregate(job, ranks, 5.0)
    assert res["replica_shares"] == [3, 1]
    assert res["replica_own_s"] == [[1.9, 1.6], [0.6, None]]
    assert worker.aggregate(job, [{**base, "rank": 0, "iteration_s": [1.0]}], 1.0)["replica_own_s"] is None


def test_layer_list_is_the_zoo_layer_list():
    for name in ("gpt2-tiny", "gpt2-tiny-8", "gpt2-amp"):
        model = load_model(name)
        specs = layer_specs(model, TpGroup.single())
        assert len(specs) == model.num_layers
        tied = [i for i, s in enumerate(specs) if hasattr(s, "key")]
        assert tied == [i for i, l in enumerate(model.layers) if l.tied] == [0, model.num_layers - 2]
    model = load_model("gpt2-tiny")
    for i, layer in enumerate(model.layers):
        params = sum(p.numel() for p in build_layer(model, i).parameters())
        assert params == layer.params, (i, layer.kind)  # the LM head's params are the tied word embedding
    with pytest.raises(ValueError, match="GPT-2-family"):
        check_gpt_layout(load_model("gpt2-tiny").with_frozen_prefix(0).__class__(
            "x", model.layers[:3], seq_len=1, hidden=1, heads=1, vocab=1))


def test_saved_activations_counts_storages_once_and_skips_parameters():
    lin = torch.nn.Linear(64, 64)
    x = torch.randn(8, 64, requires_grad=True)
    probe = SavedActivations(lin.parameters())
    with probe:
        y = torch.relu(lin(x))  # linear saves x (and its weight: excluded); relu saves its output
        z = (y * y).sum()  # saves y twice (same storage)
    assert probe.live_bytes == 2 * 8 * 64 * 4
    z.backward()
    del y, z
    import gc

    gc.collect()
    assert probe.live_bytes == 0 and probe.peak_bytes == 2 * 8 * 64 * 4


def test_cpu_allocation_trace_sees_the_peak():
    keep = torch.zeros(1000, 1000)  # 4 MB live before
    with CpuAllocationTrace() as trace:
        a = torch.ones(2000, 1000)  # +8 MB
        del a
        b = torch.ones(500, 1000)  # +2 MB
    assert trace.baseline_bytes >= keep.numel() * 4
    assert trace.peak_delta_bytes >= 8_000_000 and trace.peak_delta_bytes < 10_100_000
    del b, keep
