"""Bandwidth by link class (ampe.costmodel.links): the same numbers as the dense matrix the spec rules define, for
every query the cost model makes, and a 16,384-device cluster evaluated in a process held under 2 GB."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from ampe.costmodel.calibration import calibrated_cluster
from ampe.costmodel.cluster import GBPS, cluster_from_dict, load_cluster
from ampe.formats.calibration import CalibrationParams

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "cluster_specs").glob("*.yaml"))
NODE_SPECS = [p for p in SPECS if "bandwidth_matrix_gbps" not in yaml.safe_load(p.read_text())]  # by the rules

# overrides between nodes of two groups, a repeated pair (the last one wins), the same pair named both ways, and a
# node paired with itself (its intra-node links)
LINKED = {"name": "linked", "nodes": [
    {"name": "a", "gpu": "A100-80GB", "count": 4, "intra_gbps": 2400, "inter_gbps": 200, "repeat": 3},
    {"name": "b", "gpu": "A40", "count": 2, "intra_gbps": 64, "inter_gbps": 100, "repeat": 2},
    {"name": "c", "gpu": "T4", "count": 1, "intra_gbps": 50, "inter_gbps": 50}],
    "links": [{"a": "a-0", "b": "b-1", "gbps": 25}, {"a": "a-2", "b": "c", "gbps": 10},
              {"a": "b-1", "b": "a-0", "gbps": 40}, {"a": "b-0", "b": "b-0", "gbps": 32},
              {"a": "a-1", "b": "a-2", "gbps": 150}]}


def reference_matrix(spec: dict) -> np.ndarray:
    """The dense device×device matrix (bytes/s) by the spec rules, one pair at a time."""
    nodes = []  # (name, plain name or None, intra, inter, count)
    for nd in spec["nodes"]:
        for r in range(nd.get("repeat", 1)):
            plain = nd["name"] if nd.get("repeat", 1) == 1 else None
            nodes.append((f"{nd['name']}-{r}", plain, nd["intra_gbps"], nd["inter_gbps"], nd["count"]))
    name_of = {}
    for k, (full, plain, *_rest) in enumerate(nodes):
        name_of[full] = k
        if plain:
            name_of[plain] = k
    link = {}
    for lk in spec.get("links", []):
        a, b = name_of[lk["a"]], name_of[lk["b"]]
        link[(a, b)] = link[(b, a)] = lk["gbps"]
    dev_node = [k for k, nd in enumerate(nodes) for _ in range(nd[4])]
    n = len(dev_node)
    out = np.empty((n, n))
    for i in range(n):
        for j in range(n):
            a, b = dev_node[i], dev_node[j]
            if i == j:
                out[i, j] = np.inf
            elif (a, b) in link:
                out[i, j] = link[(a, b)] * GBPS
            elif a == b:
                out[i, j] = nodes[a][2] * GBPS
            else:
                out[i, j] = min(nodes[a][3], nodes[b][3]) * GBPS
    return out


@pytest.mark.parametrize("spec", [LINKED] + [yaml.safe_load(p.read_text()) for p in NODE_SPECS],
                         ids=["linked"] + [p.stem for p in NODE_SPECS])
def test_pairs_equal_the_spec_rules(spec):
    c = cluster_from_dict(spec)
    ref = reference_matrix(spec)
    ids = np.arange(c.size)
    assert np.array_equal(c.bandwidth.pairs(ids[:, None], ids[None, :]), ref)
    assert np.array_equal(c.bandwidth.dense(), ref)
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, c.size, 50), rng.integers(0, c.size, 50)
    assert np.array_equal(c.bandwidth[a, b], ref[a, b])  # pairwise, as numpy's fancy indexing
    grid = rng.integers(0, c.size, (3, 2, 2))
    assert np.array_equal(c.bandwidth[grid, np.roll(grid, -1, axis=1)], ref[grid, np.roll(grid, -1, axis=1)])
    for i, j in [(0, c.size - 1), (c.size - 1, 0), (1, 1)]:
        assert c.link(i, j) == ref[i, j]
        assert c.bandwidth[i, j] == ref[i, j]
    for not_a_pair in ((slice(None), 0), (0,), (0.5, 1), (np.eye(c.size, dtype=bool),)):
        with pytest.raises(TypeError, match="dense"):
            c.bandwidth[not_a_pair]  # not an array: no silent matrix


def test_linked_overrides_apply():
    c = cluster_from_dict(LINKED)
    nodes = c.node_devices()
    a0, a1, a2, b0, b1, c0 = (nodes[k][0] for k in ("a-0", "a-1", "a-2", "b-0", "b-1", "c-0"))
    assert c.link(a0, b1) == 40 * GBPS  # given twice, both ways: the last wins
    assert c.link(a2, c0) == 10 * GBPS
    assert c.link(b0, nodes["b-0"][1]) == 32 * GBPS  # a node paired with itself: its intra-node links
    assert c.link(b1, nodes["b-1"][1]) == 64 * GBPS
    assert c.link(a1, a2) == 150 * GBPS
    assert c.link(a0, a1) == 200 * GBPS


def test_subset_and_calibration_scale_as_the_matrix():
    c = cluster_from_dict(LINKED)
    ref = reference_matrix(LINKED)
    keep = [7, 0, 12, 3, 9, 13, 4]
    part = c.subset(keep)
    assert np.array_equal(part.bandwidth.dense(), ref[np.ix_(keep, keep)])
    node = np.array([c.devices[d].node for d in range(c.size)])
    cal = calibrated_cluster(c, CalibrationParams(link_efficiency={"intra": 0.7, "inter": 0.45}))
    assert np.array_equal(cal.bandwidth.dense(), ref * np.where(node[:, None] == node[None, :], 0.7, 0.45))


def test_device_matrix_is_kept(tmp_path):
    m = [[0, 10, 20], [10, 0, 30], [20, 30, 0]]
    spec = {"name": "m", "nodes": [{"name": "x", "gpu": "T4", "count": 3, "intra_gbps": 50, "inter_gbps": 50}],
            "bandwidth_matrix_gbps": m}
    c = cluster_from_dict(spec)
    ref = np.array(m, dtype=float) * GBPS
    np.fill_diagonal(ref, np.inf)
    assert np.array_equal(c.bandwidth.dense(), ref)
    assert c.link(2, 1) == 30 * GBPS
    assert np.array_equal(c.subset([2, 0]).bandwidth.dense(), ref[np.ix_([2, 0], [2, 0])])


def three_types_16k() -> dict:
    return {"name": "three-types-16384", "nodes": [
        {"name": "n0", "gpu": "H100-80GB", "count": 8, "intra_gbps": 2400, "inter_gbps": 400, "repeat": 683},
        {"name": "n1", "gpu": "A100-80GB", "count": 8, "intra_gbps": 2400, "inter_gbps": 200, "repeat": 683},
        {"name": "n2", "gpu": "A100-40GB", "count": 8, "intra_gbps": 2400, "inter_gbps": 200, "repeat": 682}]}


def test_16k_devices_are_kept_by_link_class():
    c = cluster_from_dict(three_types_16k())
    assert c.size == 16384
    bw = c.bandwidth
    held = sum(x.nbytes for x in (bw.node_of, bw.intra, bw.inter, bw.override_keys, bw.override_values))
    assert bw.matrix is None and held < 1 << 20  # the dense float64 matrix would be 2 GiB
    with pytest.raises(ValueError, match="16384 devices"):
        bw.dense()
    last_h100, first_a100 = 683 * 8 - 1, 683 * 8
    assert c.link(0, 1) == 2400 * GBPS and c.link(0, 8) == 400 * GBPS
    assert c.link(last_h100, first_a100) == 200 * GBPS
    assert c.subset(range(8 * 683, 16384)).size == 16384 - 8 * 683


def test_evaluate_16k_devices_under_2_gb(tmp_path):
    spec, strategy = tmp_path / "c.yaml", tmp_path / "s.json"
    spec.write_text(yaml.safe_dump(three_types_16k()))
    strategy.write_text(json.dumps({"pp": 16, "dp": 128, "tp": 8, "mbs": 1, "gbs": 2048}))
    limit = 2 << 30

    def cap() -> None:  # the child's address space: an allocation beyond 2 GiB fails there
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "ampe", "evaluate", "--cluster", str(spec), "--model",
                             "llama-3.1-405b", "--strategy", str(strategy), "--json", str(tmp_path / "out.json")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, preexec_fn=cap)
    err = proc.stderr.read().decode() if proc.stderr else ""
    _, status, usage = os.wait4(proc.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, err[-2000:]
    assert usage.ru_maxrss * 1024 < limit  # peak resident set (Linux: KiB)
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["cluster"] == "three-types-16384"
    result = out["results"][0]
    assert len(result["stage_times_s"]) == 16 and result["iteration_s"] > 0
    assert result["dp_sync_s"] > 0  # the data-parallel rings across 128 nodes were costed


def test_load_bundled_specs_keep_no_dense_matrix():
    for p in SPECS:
        c = load_cluster(p)
        dense = yaml.safe_load(p.read_text()).get("bandwidth_matrix_gbps") is not None
        assert (c.bandwidth.matrix is not None) == dense, p.name
