"""Issue 36, items 2 and 5 (cluster references): ids and indices read in one place (ASCII digits, bounded length)
and cluster changes that say what they do: a node-level straggler healed device by device, a device named twice
in ``stragglers`` refused, a fragment that would redefine a GPU type the cluster's nodes run refused."""

from __future__ import annotations

import pytest

from ampe.costmodel.cluster import cluster_from_dict
from ampe.costmodel.cluster_change import ClusterChange, changed_spec, node_ref
from ampe.errors import InputError
from ampe.parsers import MAX_INDEX_DIGITS, parse_index

SPEC = {"name": "two", "nodes": [{"name": "a", "gpu": "A100-80GB", "count": 2, "intra_gbps": 2400,
                                  "inter_gbps": 200, "repeat": 2}]}
HUGE = "9" * 5000  # int() refuses numbers over 4,300 digits with a ValueError


@pytest.mark.parametrize(("text", "want"), [("0", 0), ("17", 17), ("007", 7), ("9" * MAX_INDEX_DIGITS, 10**9 - 1),
                                            ("", None), ("²", None), ("٣", None), ("1²", None), ("-1", None),
                                            (" 1", None), ("1.0", None), ("9" * (MAX_INDEX_DIGITS + 1), None),
                                            (HUGE, None)])
def test_parse_index_takes_ascii_digits_of_bounded_length_only(text, want):
    assert parse_index(text) == want


@pytest.mark.parametrize("ref", ["²", HUGE, "a-0:²", f"a-0:{HUGE}", "٣", "a-0:٣"])
def test_without_and_slow_refuse_odd_digits_in_one_line(ref):
    cluster = cluster_from_dict(SPEC)
    for flag in ("--without", "--slow"):
        with pytest.raises(InputError) as e:
            node_ref(cluster, ref, flag)
        assert e.value.field == flag or flag in str(e.value)


@pytest.mark.parametrize("where", ["down", "stragglers"])
@pytest.mark.parametrize("local", ["²", HUGE, "٣", ""])
def test_spec_references_refuse_odd_digits(where, local):
    value = [f"a-0:{local}"] if where == "down" else {f"a-0:{local}": 2.0}
    with pytest.raises(InputError, match="node a-0 has devices"):
        cluster_from_dict({**SPEC, where: value})


def test_a_device_named_twice_in_stragglers_is_refused():
    for stragglers in ({"a-0": 2.0, "a-0:1": 3.0}, {"a-0:1": 2.0, "a-0:01": 3.0}):
        with pytest.raises(InputError, match="named twice"):
            cluster_from_dict({**SPEC, "stragglers": stragglers})


def test_a_node_level_straggler_is_healed_device_by_device():
    cluster = cluster_from_dict({**SPEC, "stragglers": {"a-0": 2.0}})
    raw = changed_spec({**SPEC, "stragglers": {"a-0": 2.0}}, cluster, ClusterChange(slow=(("a-0:0", 1.0),)))
    assert raw["stragglers"] == {"a-0:1": 2.0}
    new = cluster_from_dict(raw)
    assert [d.gpu.slowdown for d in new.devices] == [1, 2, 1, 1]
    healed = changed_spec(raw, new, ClusterChange(slow=(("a-0", 1.0),)))  # the node as a whole: its entries go
    assert "stragglers" not in healed
    slower = changed_spec(raw, new, ClusterChange(slow=(("a-0", 3.0),)))
    assert slower["stragglers"] == {"a-0": 3.0}


def test_a_fragment_may_not_redefine_a_type_the_cluster_runs(tmp_path):
    cluster = cluster_from_dict(SPEC)
    frag = tmp_path / "add.yaml"
    frag.write_text("nodes: [{name: b, gpu: A100-80GB, count: 2, intra_gbps: 2400, inter_gbps: 200}]\n"
                    "gpu_types: {A100-80GB: {base: A100-80GB, peak_tflops_fp16: 10}}\n")
    with pytest.raises(InputError, match="already use GPU type A100-80GB") as e:
        changed_spec(SPEC, cluster, ClusterChange(add=str(frag)))
    assert str(frag) in str(e.value)
