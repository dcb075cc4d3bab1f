"""A misspelled key is reported as the unknown key (with the closest known one), never as the key it was meant to be
"missing"; a custom GPU type names every missing field at once."""

from __future__ import annotations

import pytest
import yaml

from ampe.costmodel.cluster import cluster_from_dict, load_cluster
from ampe.costmodel.zoo import model_from_dict
from ampe.errors import InputError
from ampe.formats.measurement import Measurement

NODE = "{name: a, gpu: A100-80GB, count: 8, intra_gbps: 600, inter_gbps: 100}"


@pytest.mark.parametrize("text, field, hint", [
    # misspelled required key: pydantic also reports intra_gbps missing; the typo must win
    ("name: x\nnodes: [{name: a, gpu: A100-80GB, count: 8, intra_gpbs: 600, inter_gbps: 100}]\n",
     "nodes[0].intra_gpbs", "did you mean intra_gbps?"),
    # misspelled optional key (nothing missing to compare with: the model's fields give the hint)
    (f"name: x\nnodes: [{NODE[:-1]}, repeats: 2}}]\n", "nodes[0].repeats", "did you mean repeat?"),
    (f"name: x\nlatency: 5\nnodes: [{NODE}]\n", "latency", "did you mean latency_us?"),
    (f"name: x\ngpu_types: {{Mine: {{base: A100-80GB, tdp: 300}}}}\nnodes: [{NODE}]\n", "gpu_types.Mine.tdp",
     "did you mean tdp_w?"),
    (f"name: x\nnodes: [{NODE[:-1]}, zzz: 1}}]\n", "nodes[0].zzz", "known: name, gpu, count"),
])
def test_unknown_key_is_named_with_a_hint(tmp_path, run_cli, text, field, hint):
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        load_cluster(path)
    assert err.value.field == field and err.value.message.startswith("unknown key"), err.value
    assert hint in err.value.message
    code, _out, errtext = run_cli("evaluate", "--cluster", path, "--model", "gpt2", "--strategy", "/nonexistent")
    lines = errtext.strip().splitlines()
    assert code == 2 and len(lines) == 1 and field in lines[0] and "Field required" not in lines[0]


def test_model_yaml_and_file_formats_name_the_unknown_key():
    raw = {"name": "m", "layers": [{"params": 1, "fwd_flop": 2.0, "out_elems": 4}]}
    with pytest.raises(InputError) as err:
        model_from_dict(raw, "m.yaml")
    assert err.value.field == "layers[0].fwd_flop" and "did you mean fwd_flops?" in err.value.message
    line = {"strategy": {"pp": 1, "dp": 1, "tp": 1, "mbs": 1, "gbs": 1, "partition": [0, 1]},
            "iteraton_s": 1.0, "status": "ok"}
    with pytest.raises(InputError) as err:
        Measurement.parse(line, "m.jsonl", "line 1")
    assert err.value.field == "line 1.iteraton_s" and "did you mean iteration_s?" in err.value.message


def test_a_custom_gpu_type_names_every_missing_field_in_one_line():
    spec = yaml.safe_load("name: x\ngpu_types: {Mine: {memory_gb: 40, tdp_w: 300}}\n"
                          "nodes: [{name: a, gpu: Mine, count: 2, intra_gbps: 5, inter_gbps: 5}]\n")
    with pytest.raises(InputError) as err:
        cluster_from_dict(spec, "s.yaml")
    assert err.value.field == "gpu_types.Mine"
    for name in ("peak_tflops_fp16", "peak_tflops_fp32", "memory_bandwidth_gbs", "idle_w", "sm_clock_min_mhz",
                 "sm_clock_max_mhz", "sm_clock_step_mhz"):
        assert name in err.value.message, name
    assert "memory_gb," not in err.value.message and "tdp_w" not in err.value.message  # given
    spec["gpu_types"]["Mine"] = {"memory_gb": 40, "peak_tflops_fp16": 100, "peak_tflops_fp32": 20,
                                 "memory_bandwidth_gbs": 1000, "tdp_w": 300, "sm_clock_min_mhz": 200,
                                 "sm_clock_max_mhz": 1400, "sm_clock_step_mhz": 15}
    with pytest.raises(InputError) as err:  # one missing: named as the field
        cluster_from_dict(spec, "s.yaml")
    assert err.value.field == "gpu_types.Mine.idle_w"
