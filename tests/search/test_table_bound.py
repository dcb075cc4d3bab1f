"""The exact partition's memory bound: degree choices whose pp·(L−pp+1)² band table is over MAX_BAND_ENTRIES are
left out before any table is built (and counted); when all are, the search is one InputError naming the layers."""

from __future__ import annotations

import pytest

from ampe.costmodel.cluster import cluster_from_dict
from ampe.costmodel.zoo import model_from_dict
from ampe.dp_assign import MAX_BAND_ENTRIES, band_entries
from ampe.errors import InputError
from ampe.search.engine import _largest_layers, _within_table_bound
from ampe.search.space import enumerate_degrees

CLUSTER = cluster_from_dict({"name": "c24", "nodes": [{"name": "h", "gpu": "cpu", "count": 8, "intra_gbps": 40,
                                                       "inter_gbps": 40, "repeat": 3}]})


def _model(layers: int):
    return model_from_dict({"base": "gpt2-tiny", "layers": layers - 6}, "m.yaml")  # the zoo adds 6 non-block layers


def test_band_entries_and_the_largest_layer_count_agree():
    assert band_entries(10, 3) == 3 * 8 * 8
    assert band_entries(2, 3) == 0
    for pp in (2, 3, 24, 100):
        top = _largest_layers(pp)
        assert band_entries(top, pp) <= MAX_BAND_ENTRIES < band_entries(top + 1, pp)


def test_deep_pipelines_are_left_out_and_counted_shallow_ones_kept():
    model = _model(1300)  # pp 2: 3.4 million entries; pp 24: 39 million, over the bound
    degrees = enumerate_degrees(CLUSTER, model.num_layers, 24)
    kept, left_out = _within_table_bound(degrees, model)
    assert {d.pp for d in kept} and max(d.pp for d in kept) < 24 and 24 in {d.pp for d in degrees}
    assert left_out == sum(1 for d in degrees if band_entries(model.num_layers, d.pp) > MAX_BAND_ENTRIES) > 0
    assert len(kept) + left_out == len(degrees)


def test_a_model_no_pipeline_can_partition_is_one_line():
    model = _model(10_000)
    with pytest.raises(InputError, match=r"m\.yaml: layers: 10000 layers: the exact partition needs a 0\.7 GiB table "
                                         r"even at pp 1, the smallest this cluster allows"):
        _within_table_bound(enumerate_degrees(CLUSTER, model.num_layers, 24), model)
