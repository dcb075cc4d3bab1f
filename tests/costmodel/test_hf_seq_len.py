"""`--seq-len` for Hugging Face configs: the default cut of a long context is said in one line, a chosen length is
planned and recorded in the plan, and everything that rebuilds the plan's model (cost inputs, trial jobs, the
export a user's script reads) rebuilds it at that length; a length above the context, or --seq-len on a model that
has its own, is refused with exit 2."""

from __future__ import annotations

import json

import pytest

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.zoo import context_cut, load_model
from ampe.errors import InputError
from ampe.formats.export import ExportFile
from ampe.trials.planfile import load_plan
from tests.support.trial_fixtures import CLUSTER_YAML, FAKE_WORKER

LLAMA_8K = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
            "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
            "vocab_size": 128256, "max_position_embeddings": 8192, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16"}
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "vocab_size": 256,
        "max_position_embeddings": 256, "torch_dtype": "float32"}


def _config(tmp_path, raw, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(raw))
    return str(path)


def test_default_cut_is_said_and_seq_len_plans_the_full_context(tmp_path):
    path = _config(tmp_path, LLAMA_8K)
    cut, full = load_model(path), load_model(path, seq_len=8192)
    assert cut.seq_len == 4096 and full.seq_len == 8192 and load_model(path, seq_len=1024).seq_len == 1024
    note = context_cut(path, None)
    assert note is not None and "8192" in note and "4096" in note and "--seq-len" in note
    assert context_cut(path, 8192) is None and context_cut(path, 2048) is None  # asked for: nothing to say
    assert context_cut(_config(tmp_path, {**LLAMA_8K, "max_position_embeddings": 4096}, "c4k.json"), None) is None
    # the length reaches the layers: a block's attention scores grow with s², its other activations with s
    assert full.layers[1].fwd_flops > 2 * cut.layers[1].fwd_flops
    gpt = _config(tmp_path, {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256,
                             "n_positions": 1024}, "gpt.json")
    assert load_model(gpt).seq_len == 1024 and load_model(gpt, seq_len=512).seq_len == 512
    with pytest.raises(InputError, match="n_positions 1024"):
        load_model(gpt, seq_len=2048)


def test_cli_prints_one_line_for_a_cut_and_refuses_a_length_above_the_context(tmp_path, run_cli):
    path = _config(tmp_path, LLAMA_8K)
    spec = tmp_path / "c.yaml"
    spec.write_text("name: c\nnodes: [{name: a, gpu: A100-80GB, count: 8, intra_gbps: 600, inter_gbps: 100}]\n")
    strat = tmp_path / "s.json"
    strat.write_text(json.dumps({"pp": 2, "dp": 4, "tp": 1, "mbs": 1, "gbs": 32}))
    base = ("evaluate", "--cluster", spec, "--model", path, "--strategy", strat)
    code, _, err = run_cli(*base)
    assert code == 0 and len(err.strip().splitlines()) == 1 and "context 8192 tokens" in err
    code, _, err = run_cli(*base, "--seq-len", "8192")
    assert code == 0 and "context" not in err
    code, _, err = run_cli(*base, "--seq-len", "16384")
    assert code == 2 and err.strip().count("\n") == 0 and "--seq-len" in err and "8192" in err
    code, _, err = run_cli("evaluate", "--cluster", spec, "--model", "llama-3.1-8b", "--strategy", strat,
                           "--seq-len", "2048")
    assert code == 2 and "base: llama-3.1-8b" in err and err.strip().count("\n") == 0


def test_the_plan_records_seq_len_and_trials_and_exports_rebuild_it(tmp_path, run_cli):
    path = _config(tmp_path, TINY)
    spec = tmp_path / "cluster.yaml"
    spec.write_text(CLUSTER_YAML)
    plan = tmp_path / "plan.json"
    code, _, err = run_cli("search", "--cluster", spec, "--model", path, "--global-batch", "4", "--seq-len", "128",
                           "--energy-planner", "none", "--top-k", "2", "--out", plan)
    assert code == 0, err
    assert json.loads(plan.read_text())["inputs"]["seq_len"] == 128
    loaded = load_plan(plan)
    assert loaded.seq_len == 128
    assert loaded.cost_inputs(load_cluster(spec))[0].seq_len == 128
    out = tmp_path / "runs"
    code, _, err = run_cli("trial", "--plan", plan, "--top-k", "1", "--worker", FAKE_WORKER, "--no-prebuild",
                           "--launcher", "local", "--warmup", "0", "--iters", "1", "--freq-backend", "none",
                           "--progress", "none", "--out", out)
    assert code == 0, err
    jobs = list((out / "trials").glob("*/job.json"))
    assert jobs and all(json.loads(j.read_text())["seq_len"] == 128 for j in jobs)
    exported = tmp_path / "export"
    code, _, err = run_cli("export", "--plan", plan, "--out", exported, "--script", "train.py")
    assert code == 0, err
    doc = ExportFile.parse(json.loads((exported / "export.json").read_text()), "export.json")
    assert doc.seq_len == 128  # what ampe.runtime.user rebuilds the plan's model at


def test_a_plans_seq_len_is_refused_naming_the_plan_field(tmp_path, run_cli):
    """A plan whose inputs.seq_len its model cannot take (a zoo model; above a config's context): the error names
    the plan file and ``inputs.seq_len``, not a --seq-len flag the command was never given."""
    spec = tmp_path / "cluster.yaml"
    spec.write_text(CLUSTER_YAML)
    for model, seq_len, why in (("gpt2", 512, "its own seq_len 1024"), (_config(tmp_path, TINY), 4096, "context")):
        plan = tmp_path / "plan.json"
        code, _, err = run_cli("search", "--cluster", spec, "--model", model, "--global-batch", "4",
                               "--energy-planner", "none", "--top-k", "1", "--out", plan)
        assert code == 0, err
        raw = json.loads(plan.read_text())
        raw["inputs"]["seq_len"] = seq_len
        plan.write_text(json.dumps(raw))
        for args in (("trial", "--plan", plan, "--dry-run"), ("frontier", "--plan", plan, "--rank", "1", "--out",
                                                              tmp_path / "f.json")):
            code, _, err = run_cli(*args)
            assert code == 2 and err.strip().count("\n") == 0, err
            assert f"{plan}: inputs.seq_len:" in err and why in err, err
        with pytest.raises(InputError) as e:
            load_plan(plan).cost_inputs(load_cluster(spec))
        assert (e.value.source, e.value.field) == (str(plan), "inputs.seq_len")
