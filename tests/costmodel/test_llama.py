"""Llama-family models: parameter counts against the published totals, hand-counted activations, Hugging Face
config files (read from disk), and the one-line errors for what ampe cannot model."""

from __future__ import annotations

import json

import pytest
import yaml

from ampe.costmodel.llama import LLAMA_ZOO
from ampe.costmodel.zoo import load_model, zoo_names
from ampe.errors import InputError

# Published totals: the safetensors parameter counts on the Hugging Face hub (the model cards round them: Llama 3.2
# 1B "1.24B", Llama 3.1 8B "8.03B", 70B "70.6B", 405B "406B", Qwen2.5-7B "7.61B", Mistral-7B-v0.1 "7.24B").
PUBLISHED = {
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800,
    "qwen2.5-7b": 7_615_616_512,
    "mistral-7b": 7_241_732_096,
}

# The fields of the published config.json files that ampe reads
HF_CONFIGS = {
    "llama-3.1-8b": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
                     "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
                     "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
                     "tie_word_embeddings": False, "torch_dtype": "bfloat16", "rope_theta": 500000.0},
    "llama-3.2-1b": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
                     "intermediate_size": 8192, "num_attention_heads": 32, "num_hidden_layers": 16,
                     "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
                     "max_position_embeddings": 131072, "tie_word_embeddings": True, "torch_dtype": "bfloat16"},
    "qwen2.5-7b": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
                   "intermediate_size": 18944, "num_attention_heads": 28, "num_hidden_layers": 28,
                   "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 131072,
                   "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_sliding_window": False,
                   "sliding_window": 131072},
    "mistral-7b": {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
                   "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
                   "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 32768,
                   "sliding_window": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_published_totals(name):
    model = load_model(name)
    assert name in zoo_names()
    assert model.unique_params() == PUBLISHED[name]  # exact: the counts are integers (a dropped bias fails)


def test_qwen_block_hand_count_includes_the_qkv_biases():
    # Qwen2.5-7B block: Q, O 3584², K, V 3584·512 (4 KV heads of 128), Q/K/V biases, SwiGLU 3·3584·18944, two RMSNorms
    h, q, k, f = 3584, 3584, 512, 18944
    block = load_model("qwen2.5-7b").layers[1]
    assert block.kind == "transformer"
    assert block.params == 2 * h * q + 2 * h * k + (q + 2 * k) + 3 * h * f + 2 * h == 233_057_792


def test_llama_block_hand_count():
    # Llama 3.1 8B block: Q, O 4096², K, V 4096·1024 (8 KV heads of 128), SwiGLU 3·4096·14336, two RMSNorms
    h, q, k, f, s = 4096, 4096, 1024, 14336, 4096
    m = load_model("llama-3.1-8b")
    block = m.layers[1]
    assert block.kind == "transformer" and m.family == "llama"
    assert block.params == 2 * h * q + 2 * h * k + 3 * h * f + 2 * h == 218_112_000
    assert block.fwd_flops == pytest.approx(2 * s * (2 * h * q + 2 * h * k + 3 * h * f) + 4 * s * s * q)
    # bf16, flash attention: 8·s·h (norm inputs and outputs) + 2·s·(q + 2k) (Q, K, V) + 2·s·q (attention output)
    # + 8·s·f (gate, up, SiLU, product) bytes per sample; eager adds the 2·a·s² softmax output and K, V repeated
    # per query head
    # + the two norms' 1/rms, + SDPA's fp32 log-sum-exp per query and head (32 heads)
    kept = 8 * s * h + 4 * s + 2 * s * (q + 2 * k) + 2 * s * q + 8 * s * f + 4 * 32 * s
    assert block.act_bytes(1) == pytest.approx(kept)
    # tp 16 > 8 K/V heads: each rank holds the one K/V head its two query heads use (replicated over 2 ranks)
    per_rank = 8 * s * h + 4 * s + (2 * s * q + 2 * s * q + 8 * s * f + 4 * 32 * s) / 16 + 2 * s * 2 * k / 8
    assert block.act_bytes(16) == pytest.approx(per_rank)
    assert block.act_bytes(4) == pytest.approx(8 * s * h + 4 * s + (kept - 8 * s * h - 4 * s) / 4)
    assert block.act_bytes(1, recompute="full") == pytest.approx(2 * s * h)
    assert m.layers[0].tied is None and m.layers[-2].kind == "logits" and m.layers[-2].params == 128256 * h
    # untied head: the embedding and the head are two weights; Llama 3.2 1B ties them (counted once)
    tied = load_model("llama-3.2-1b")
    assert tied.layers[0].tied == tied.layers[-2].tied == "embed"


def test_qwen_counts_qkv_biases_and_mistral_its_sliding_window():
    qwen = load_model("qwen2.5-7b").layers[1]
    h, q, k, f = 3584, 3584, 512, 18944
    assert qwen.params == 2 * h * q + 2 * h * k + 3 * h * f + 2 * h + (q + 2 * k)
    mistral = LLAMA_ZOO["mistral-7b"]
    long = load_model("mistral-7b")
    assert mistral.sliding_window == 4096 and long.seq_len == 4096
    # attention FLOPs are 4·s²·q: ampe's runtime masks a sliding window narrower than the sequence, it does not skip
    # it (eager writes out the s×s scores; torch's SDPA computes them all) — so also beyond the window
    assert long.layers[1].score_flops == pytest.approx(4 * 4096 * 4096 * 4096)
    longer = load_model("mistral-7b").config.__class__(**{**vars(mistral), "seq_len": 8192})
    from ampe.costmodel.llama import llama_model

    eager = llama_model("m8k", longer, "eager").layers[1]
    assert eager.score_flops == pytest.approx(4 * 8192 * 8192 * 4096)
    assert eager.score_bytes_sharded >= 32 * 8192 * 8192 * 2  # the s×s scores, written out before the mask


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_hugging_face_config_file_gives_the_zoo_model(tmp_path, name):
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(HF_CONFIGS[name]))
    got, zoo = load_model(str(path)), load_model(name)
    assert got.unique_params() == zoo.unique_params()
    assert got.num_layers == zoo.num_layers and got.seq_len == 4096  # min(max_position_embeddings, 4096)
    assert [layer.fwd_flops for layer in got.layers] == [layer.fwd_flops for layer in zoo.layers]
    assert [layer.act_bytes(2) for layer in got.layers] == [layer.act_bytes(2) for layer in zoo.layers]
    assert got.name == name and got.attention == "flash" and got.dtype == "bf16"


@pytest.mark.parametrize("raw,field", [
    ({"model_type": "mamba", "hidden_size": 768}, "model_type"),
    ({"architectures": ["T5ForConditionalGeneration"]}, "model_type"),
    ({"model_type": "llama", "num_hidden_layers": 2}, "hidden_size"),
    ({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 3,
      "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 100}, "num_key_value_heads"),
    ({"model_type": "llama", "hidden_size": "big"}, "hidden_size"),
])
def test_unsupported_or_bad_config_names_the_field(tmp_path, raw, field):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(InputError) as e:
        load_model(str(path))
    assert e.value.field == field and str(path) in str(e.value)


def test_cli_unknown_architecture_is_one_line_exit_2(run_cli, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mamba"}))
    code, _, err = run_cli("search", "--cluster", "cluster_specs/local-cpu.yaml", "--model", path)
    assert code == 2 and "model_type" in err and "mamba" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["llama-3.2-1b", "qwen2.5-7b", "mistral-7b"])
def test_evaluate_takes_either_attention_kernel_for_zoo_and_hf_configs(run_cli, tmp_path, name):
    """Issue 24: `--attention eager` was refused for a 16-bit Llama-family model ("was built with FlashAttention").
    Both kernels now cost it — the zoo name (llama-3.2-1b) and Hugging Face configs (Qwen2.5, Mistral) — and eager
    keeps the s² scores (more memory per device), as a plan entry that names its kernel is re-costed with it."""
    model: object = name
    if name != "llama-3.2-1b":
        model = tmp_path / "config.json"
        model.write_text(json.dumps(HF_CONFIGS[name]))
    spec = {"name": "one-a100", "nodes": [{"name": "n", "gpu": "A100-80GB", "count": 8, "intra_gbps": 2400,
                                           "inter_gbps": 200}]}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(spec))
    (tmp_path / "s.json").write_text(json.dumps({"pp": 4, "dp": 2, "tp": 1, "mbs": 1, "gbs": 64}))
    peaks = {}
    for attention in ("eager", "flash"):
        out = tmp_path / f"{attention}.json"
        code, stdout, err = run_cli("evaluate", "--cluster", tmp_path / "c.yaml", "--model", model, "--attention",
                                    attention, "--strategy", tmp_path / "s.json", "--json", out)
        assert code == 0, err
        assert f"{attention} attention" in stdout
        peaks[attention] = max(json.loads(out.read_text())["results"][0]["memory_bytes_per_stage"])
    assert peaks["eager"] > peaks["flash"]
    # a strategy that names its kernel is costed with it when the flag leaves the choice to the model (auto)
    (tmp_path / "named.json").write_text(json.dumps({"pp": 4, "dp": 2, "tp": 1, "mbs": 1, "gbs": 64,
                                                      "attention": "eager"}))
    code, _, err = run_cli("evaluate", "--cluster", tmp_path / "c.yaml", "--model", model, "--strategy",
                           tmp_path / "named.json", "--json", tmp_path / "named-out.json")
    assert code == 0, err
    named = json.loads((tmp_path / "named-out.json").read_text())["results"][0]
    assert max(named["memory_bytes_per_stage"]) == peaks["eager"]


def test_a_model_yaml_with_base_changes_the_shape_of_a_zoo_model(tmp_path):
    path = tmp_path / "l1b-s1024.yaml"
    path.write_text(yaml.safe_dump({"base": "llama-3.2-1b", "seq_len": 1024, "layers": 4}))
    m = load_model(str(path))
    assert (m.name, m.seq_len, m.family, m.attention, m.dtype) == ("l1b-s1024", 1024, "llama", "flash", "bf16")
    assert m.num_layers == 4 + 4 and m.config.hidden == 2048 and m.config.kv_heads == 8
    full = load_model("llama-3.2-1b")
    assert m.layers[1].params == full.layers[1].params  # same block; a quarter of the sequence
    assert m.layers[1].fwd_flops < full.layers[1].fwd_flops / 4 + 1  # attention's s² share shrinks more
    assert load_model(str(path), attention="eager").layers[1].score_bytes_sharded > 0
    gpt = tmp_path / "g.yaml"
    gpt.write_text(yaml.safe_dump({"name": "gpt2-s512", "base": "gpt2", "seq_len": 512, "dtype": "bf16"}))
    g = load_model(str(gpt))
    assert (g.name, g.seq_len, g.dtype, g.num_layers) == ("gpt2-s512", 512, "bf16", 18)


@pytest.mark.parametrize("raw,field", [
    ({"base": "llama-9"}, "base"),
    ({"base": "gpt2", "kv_heads": 2}, "kv_heads"),
    ({"base": "llama-tiny", "kv_heads": 3}, "kv_heads"),
    ({"base": "gpt2", "seq_len": 0}, "seq_len"),
    ({"base": "gpt2", "dtype": "fp8"}, "dtype"),
    ({"base": "gpt2", "partition": [1]}, "partition"),
    ({"base": "llama-tiny", "heads": 3}, "heads"),
    ({"base": "llama-tiny", "head_dim": 7}, "head_dim"),
])
def test_bad_base_model_yaml_names_the_field(tmp_path, raw, field):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(InputError) as e:
        load_model(str(path))
    assert e.value.field == field, e.value
