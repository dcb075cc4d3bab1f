"""Model zoo figures and user YAML models."""

from __future__ import annotations

import pytest

from ampe.costmodel.gpt import ZOO
from ampe.costmodel.zoo import load_model, model_from_dict
from ampe.errors import InputError


@pytest.mark.parametrize("name,params", [
    ("gpt2", 124.4e6), ("gpt2-medium", 354.8e6), ("gpt2-large", 774.0e6), ("gpt2-xl", 1557.6e6),
    ("gpt2-amp", 356.9e6), ("gpt3-1.3b", 1.3e9), ("gpt3-2.7b", 2.65e9), ("gpt3-6.7b", 6.65e9),
    ("gpt3-175b", 174.6e9),
])
def test_zoo_parameter_counts(name, params):
    assert load_model(name).unique_params() == pytest.approx(params, rel=0.02)


def test_gpt2_amp_has_amps_30_layer_entries():
    m = load_model("gpt2-amp")
    kinds = [l.kind for l in m.layers]
    assert len(kinds) == 30
    assert kinds[:2] == ["embedding", "noop"] and kinds[2:26] == ["transformer"] * 24
    assert kinds[26:] == ["noop", "norm", "logits", "noop"]
    assert m.layers[0].tied == m.layers[28].tied == "embed"
    assert (m.hidden, m.heads, m.vocab, m.seq_len) == (1024, 16, 52256, 1024)


def test_all_zoo_models_load():
    for name in ZOO:
        assert load_model(name).num_layers == ZOO[name].layers + 6


def test_user_yaml_model_with_repeat_and_defaults():
    m = model_from_dict({"name": "toy", "dtype": "fp16", "layers": [
        {"kind": "embedding", "params": 1000, "fwd_flops": 0, "out_elems": 64, "tied": "e"},
        {"kind": "transformer", "params": 500, "fwd_flops": 1e6, "out_elems": 64, "repeat": 3},
        {"kind": "logits", "params": 1000, "fwd_flops": 2e5, "out_elems": 100, "tied": "e"}]})
    assert m.num_layers == 5
    assert m.unique_params() == 1000 + 3 * 500
    assert m.layers[1].tp_allreduces == 2 and m.layers[1].act_bytes(1) == 17 * 64 * 2


def test_bad_yaml_model_fields():
    with pytest.raises(InputError, match=r"layers\[0\]\.params"):
        model_from_dict({"name": "t", "layers": [{"kind": "other", "params": -1, "fwd_flops": 0, "out_elems": 1}]},
                        "m.yaml")
    with pytest.raises(InputError, match=r"layers\[0\]\.kind"):
        model_from_dict({"name": "t", "layers": [{"kind": "lstm", "params": 1, "fwd_flops": 0, "out_elems": 1}]},
                        "m.yaml")
    with pytest.raises(InputError, match="unknown model"):
        load_model("gpt5")


def test_frozen_prefix():
    m = load_model("gpt2").with_frozen_prefix(5)
    assert [l.frozen for l in m.layers[:6]] == [True] * 5 + [False]
