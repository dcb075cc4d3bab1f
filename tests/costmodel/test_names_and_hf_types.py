"""Issue 36, item 5: names limited to what can be referred to and printed (no ``:``, ``,``, ``=``, control
characters or ANSI escapes in node names; printable cluster, currency and model names), and Hugging Face configs
typed (booleans are booleans, ``sliding_window`` an integer or null, an unknown ``torch_dtype`` refused)."""

from __future__ import annotations

import pytest

from ampe.costmodel.cluster import cluster_from_dict
from ampe.costmodel.hf_config import model_from_hf_config
from ampe.errors import InputError

NODE = {"name": "a", "gpu": "A100-80GB", "count": 2, "intra_gbps": 2400, "inter_gbps": 200}
MISTRAL = {"model_type": "mistral", "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
           "num_hidden_layers": 2, "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 2048,
           "sliding_window": 1024, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


@pytest.mark.parametrize("name", ["a:1", "a,b", "a=2", "a b", "a\nb", "a\x1b[31mred", " a", "a\t"])
def test_node_names_that_references_could_not_name_are_refused(name):
    with pytest.raises(InputError, match=r"nodes\[0\]\.name"):
        cluster_from_dict({"name": "c", "nodes": [{**NODE, "name": name}]})


@pytest.mark.parametrize(("field", "value"), [("name", "c\x1b[2J"), ("currency", "US\nD"), ("currency", "\x07")])
def test_printed_names_hold_no_control_characters(field, value):
    with pytest.raises(InputError, match=field):
        cluster_from_dict({"name": "c", "nodes": [NODE], field: value})


def test_plain_names_are_kept():
    c = cluster_from_dict({"name": "my cluster (v2)", "nodes": [{**NODE, "name": "rack_1.p3-x"}], "currency": "€"})
    assert c.nodes == ("rack_1.p3-x-0",) and c.name == "my cluster (v2)"
    assert c.pricing is not None and c.pricing.currency == "€"


@pytest.mark.parametrize(("change", "field"), [
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings"),
    ({"attention_bias": 1}, "attention_bias"),
    ({"sliding_window": 1024.0}, "sliding_window"),
    ({"sliding_window": "1024"}, "sliding_window"),
    ({"torch_dtype": "float64"}, "torch_dtype"),
    ({"torch_dtype": "int8"}, "torch_dtype"),
    ({"torch_dtype": None}, "torch_dtype"),
    ({"model_type": "qwen2", "use_sliding_window": "no"}, "use_sliding_window"),
    ({"_name_or_path": "org/evil\x1b[31m"}, "_name_or_path"),
])
def test_hf_config_fields_are_typed(change, field):
    with pytest.raises(InputError) as e:
        model_from_hf_config({**MISTRAL, **change}, "config.json")
    assert e.value.field == field, e.value


def test_hf_config_values_that_mean_what_they_say():
    assert model_from_hf_config(MISTRAL, "config.json").config.sliding_window == 1024
    assert model_from_hf_config({**MISTRAL, "sliding_window": None}, "config.json").config.sliding_window == 0
    qwen = {**MISTRAL, "model_type": "qwen2", "use_sliding_window": False, "sliding_window": 3.5}  # not used: ignored
    assert model_from_hf_config(qwen, "config.json").config.sliding_window == 0
    assert model_from_hf_config({**MISTRAL, "tie_word_embeddings": True}, "config.json").config.tied
    assert model_from_hf_config({**MISTRAL, "torch_dtype": "float32"}, "config.json").dtype == "fp32"
