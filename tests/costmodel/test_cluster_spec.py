"""Cluster spec → devices and bandwidth matrix; bad specs give one line naming file and field, exit 2."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from ampe.costmodel.cluster import GBPS, cluster_from_dict, load_cluster
from ampe.errors import InputError
from tests.conftest import SPECS


def test_node_shorthand_and_repeat_expand_to_devices_in_node_order():
    c = cluster_from_dict({"name": "x", "nodes": [
        {"name": "p3", "gpu": "V100-16GB", "count": 4, "intra_gbps": 170, "inter_gbps": 10, "repeat": 3},
        {"name": "g4", "gpu": "T4", "count": 4, "intra_gbps": 50, "inter_gbps": 50}]})
    assert c.size == 16
    assert c.nodes == ("p3-0", "p3-1", "p3-2", "g4-0")
    assert [d.node for d in c.devices[:5]] == ["p3-0"] * 4 + ["p3-1"]
    assert [d.id for d in c.devices] == list(range(16))
    assert c.devices[12].gpu.name == "T4" and c.devices[11].gpu.name == "V100-16GB"
    bw = c.bandwidth.dense() / GBPS
    assert bw[0, 1] == pytest.approx(170)  # inside a p3 node
    assert bw[0, 4] == pytest.approx(10)  # p3 ↔ p3: min(10, 10)
    assert bw[0, 12] == pytest.approx(10)  # p3 ↔ g4: min(10, 50)
    assert bw[12, 13] == pytest.approx(50)  # inside g4
    assert np.all(np.isinf(np.diag(bw)))
    assert np.array_equal(bw, bw.T)


def test_links_override_node_pairs_both_ways():
    c = cluster_from_dict({"name": "x", "nodes": [
        {"name": "a", "gpu": "A100-80GB", "count": 2, "intra_gbps": 2400, "inter_gbps": 200, "repeat": 2},
        {"name": "b", "gpu": "A40", "count": 2, "intra_gbps": 200, "inter_gbps": 100}],
        "links": [{"a": "a-1", "b": "b", "gbps": 25}]})
    bw = c.bandwidth.dense() / GBPS
    assert bw[2, 4] == pytest.approx(25) and bw[4, 2] == pytest.approx(25)  # a-1 ↔ b-0 overridden
    assert bw[0, 4] == pytest.approx(100)  # a-0 ↔ b-0 default min(200, 100)
    assert bw[0, 2] == pytest.approx(200)


def test_full_matrix_overrides_everything():
    m = [[0, 10, 20], [10, 0, 30], [20, 30, 0]]
    c = cluster_from_dict({"name": "x", "nodes": [
        {"name": "n", "gpu": "T4", "count": 3, "intra_gbps": 50, "inter_gbps": 50}], "bandwidth_matrix_gbps": m,
        "latency_us": 3})
    assert (c.bandwidth.dense() / GBPS)[0, 2] == pytest.approx(20)
    assert (c.bandwidth.dense() / GBPS)[1, 2] == pytest.approx(30)
    assert c.latency_s == pytest.approx(3e-6)


def test_gpu_types_extend_catalog():
    c = cluster_from_dict({"name": "x", "gpu_types": {"L4": {"base": "T4", "memory_gb": 24, "tdp_w": 72}},
                           "nodes": [{"name": "n", "gpu": "L4", "count": 1, "intra_gbps": 1, "inter_gbps": 1}]})
    g = c.devices[0].gpu
    assert g.name == "L4" and g.memory_bytes == 24_000_000_000 and g.tdp_w == 72 and g.peak_flops_fp16 == 65e12


@pytest.mark.parametrize("spec", sorted(SPECS.glob("*.yaml")), ids=lambda p: p.name)
def test_bundled_specs_load(spec):
    c = load_cluster(spec)
    assert c.size >= 2 and np.all(c.bandwidth.dense()[~np.eye(c.size, dtype=bool)] > 0)


def test_amp_specs_match_the_paper_setups():
    het = load_cluster(SPECS / "amp-het-cluster.yaml")
    assert [d.gpu.name for d in het.devices].count("V100-16GB") == 12
    assert (het.bandwidth[0, 4] / GBPS, het.bandwidth[0, 1] / GBPS) == pytest.approx((10, 170))
    slow = load_cluster(SPECS / "mixed-h100-a100.yaml")
    nodes = slow.node_devices()
    assert slow.bandwidth[nodes["h100-1"][0], nodes["a100-0"][0]] / GBPS == pytest.approx(25)
    assert slow.bandwidth[nodes["h100-0"][0], nodes["a100-0"][0]] / GBPS == pytest.approx(200)


# ---- bad input: one line, file and field named, exit 2 ------------------------------------------------------

GOOD = {"name": "x", "nodes": [{"name": "n", "gpu": "T4", "count": 2, "intra_gbps": 50, "inter_gbps": 50}]}


def _bad(tmp_path, text: str) -> str:
    p = tmp_path / "spec.yaml"
    p.write_text(text)
    return str(p)


BAD_SPECS = {
    "unknown_gpu": ("nodes: [{name: n, gpu: Z80, count: 2, intra_gbps: 5, inter_gbps: 5}]\nname: x\n", "nodes[0].gpu"),
    "zero_bandwidth": ("name: x\nnodes: [{name: n, gpu: T4, count: 2, intra_gbps: 0, inter_gbps: 5}]\n",
                       "nodes[0].intra_gbps"),
    "negative_bandwidth": ("name: x\nnodes: [{name: n, gpu: T4, count: 2, intra_gbps: 5, inter_gbps: -1}]\n",
                           "nodes[0].inter_gbps"),
    "negative_link": ("name: x\nnodes: [{name: n, gpu: T4, count: 2, intra_gbps: 5, inter_gbps: 5}]\n"
                      "links: [{a: n-0, b: n-0, gbps: -3}]\n", "links[0].gbps"),
    "asymmetric_matrix": ("name: x\nnodes: [{name: n, gpu: T4, count: 2, intra_gbps: 5, inter_gbps: 5}]\n"
                          "bandwidth_matrix_gbps: [[0, 10], [20, 0]]\n", "bandwidth_matrix_gbps[0][1]"),
    "wrong_size_matrix": ("name: x\nnodes: [{name: n, gpu: T4, count: 2, intra_gbps: 5, inter_gbps: 5}]\n"
                          "bandwidth_matrix_gbps: [[0, 10, 1], [10, 0, 1], [1, 1, 0]]\n", "bandwidth_matrix_gbps"),
    "zero_in_matrix": ("name: x\nnodes: [{name: n, gpu: T4, count: 2, intra_gbps: 5, inter_gbps: 5}]\n"
                       "bandwidth_matrix_gbps: [[0, 0], [0, 0]]\n", "bandwidth_matrix_gbps[0][1]"),
    "yaml_syntax": ("name: x\nnodes: [{name: n, gpu: T4\n", "line"),
    "unknown_link_node": ("name: x\nnodes: [{name: n, gpu: T4, count: 2, intra_gbps: 5, inter_gbps: 5}]\n"
                          "links: [{a: n-0, b: m-0, gbps: 3}]\n", "links[0].b"),
    "not_a_mapping": ("- just\n- a list\n", "(root)"),
    "missing_nodes": ("name: x\n", "nodes"),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_bad_spec_is_one_line_with_file_and_field(case, tmp_path, run_cli):
    text, field = BAD_SPECS[case]
    path = _bad(tmp_path, text)
    with pytest.raises(InputError) as err:
        load_cluster(path)
    assert err.value.field.startswith(field), err.value
    assert path in str(err.value)
    code, _out, errtext = run_cli("evaluate", "--cluster", path, "--model", "gpt2", "--strategy", "/nonexistent")
    assert code == 2
    lines = errtext.strip().splitlines()
    assert len(lines) == 1 and path in lines[0] and field in lines[0] and "Traceback" not in errtext


def test_missing_file_is_exit_2(run_cli, tmp_path):
    code, _, err = run_cli("evaluate", "--cluster", tmp_path / "nope.yaml", "--model", "gpt2", "--strategy", "x")
    assert code == 2 and "nope.yaml: file not found" in err and len(err.strip().splitlines()) == 1


def test_unknown_gpu_names_known_types():
    with pytest.raises(InputError, match=r"known: .*T4"):
        cluster_from_dict(yaml.safe_load(BAD_SPECS["unknown_gpu"][0]), "s.yaml")


@pytest.mark.parametrize("node, field", [
    ({"count": True}, "nodes[0].count"),
    ({"intra_gbps": True}, "nodes[0].intra_gbps"),
    ({"inter_gbps": float("inf")}, "nodes[0].inter_gbps"),
    ({"repeat": 100000, "count": 4096}, "nodes"),  # 409.6 M devices: refused before anything is built
])
def test_nonsense_node_fields_are_refused(node, field):
    spec = {"name": "c", "nodes": [{"name": "n", "gpu": "A100-40GB", "count": 4, "intra_gbps": 100,
                                    "inter_gbps": 10, **node}]}
    with pytest.raises(InputError) as e:
        cluster_from_dict(spec, "c.yaml")
    assert e.value.field == field


@pytest.mark.parametrize("gpu, field", [
    ({"idle_w": 500}, "gpu_types.X.idle_w"),  # above the 400 W board limit
    ({"memory_gb": float("inf")}, "gpu_types.X.memory_gb"),
    ({"sm_clock_step_mhz": 0.000001}, "gpu_types.X.sm_clock_step_mhz"),  # a billion clocks
])
def test_nonsense_gpu_types_are_refused(gpu, field):
    spec = {"name": "c", "gpu_types": {"X": {"base": "A100-40GB", **gpu}},
            "nodes": [{"name": "n", "gpu": "X", "count": 4, "intra_gbps": 100, "inter_gbps": 10}]}
    with pytest.raises(InputError) as e:
        cluster_from_dict(spec, "c.yaml")
    assert e.value.field == field


def test_a_misspelled_strategy_key_is_refused_not_ignored(run_cli, tmp_path):
    """Extra keys are allowed (a plan entry is a strategy), but a near miss of a strategy key would silently fall
    back to a default: a misspelled partition would be replaced by the DP's."""
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"pp": 2, "dp": 2, "tp": 1, "mbs": 1, "gbs": 8, "partiton": [0, 5, 10],
                                "rank": 1, "predicted": {}}))
    code, _, err = run_cli("evaluate", "--cluster", "cluster_specs/local-cpu-4.yaml", "--model", "gpt2-tiny",
                           "--strategy", path)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "partiton" in err and "did you mean 'partition'" in err and "Traceback" not in err
    path.write_text(json.dumps({"pp": 2, "dp": 2, "tp": 1, "mbs": 1, "gbs": 8, "partition": [0, 5, 10],
                                "rank": 1, "predicted": {}, "placement_name": "x"}))
    code, _, err = run_cli("evaluate", "--cluster", "cluster_specs/local-cpu-4.yaml", "--model", "gpt2-tiny",
                           "--strategy", path)
    assert code == 0, err


def test_the_footprint_fields_of_a_gpu_type_and_the_old_reserved_gb():
    """The footprint beyond the model's tensors is set per GPU type by its named parts (docs/reference/
    cluster_spec.md); the one `reserved_gb` of before is refused with a pointer to them."""
    def spec(**fields):
        return {"name": "one", "nodes": [{"name": "n", "gpu": "H100-80GB", "count": 1, "intra_gbps": 100,
                                          "inter_gbps": 100}], "gpu_types": {"H100-80GB": fields}}

    gpu = cluster_from_dict(spec(context_gb=2.0, workspace_gb=0.2, fragmentation=0.02, fragmentation_expandable=0.005,
                                 memory_reserve=0.1)).devices[0].gpu
    assert (gpu.context_bytes, gpu.workspace_bytes) == (2_000_000_000, 200_000_000)
    assert (gpu.fragmentation, gpu.fragmentation_expandable, gpu.memory_reserve) == (0.02, 0.005, 0.1)
    default = cluster_from_dict(spec()).devices[0].gpu
    assert default.memory_reserve == 0.05 and default.context_bytes == int(1.65 * (1 << 30))
    with pytest.raises(InputError, match=r"gpu_types\.H100-80GB\.reserved_gb: no longer used.*context_gb"):
        cluster_from_dict(spec(reserved_gb=1.0))
    for bad in ({"memory_reserve": 1.0}, {"fragmentation": -0.1}, {"context_gb": -1}):
        with pytest.raises(InputError, match=next(iter(bad))):
            cluster_from_dict(spec(**bad))
