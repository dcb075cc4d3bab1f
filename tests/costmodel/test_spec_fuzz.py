"""Property test: randomly mutated specs never escape the loader as anything but InputError."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampe.costmodel.cluster import cluster_from_dict
from ampe.errors import InputError
from tests.support import fuzz

BASE = {
    "name": "fuzz",
    "nodes": [
        {"name": "p3", "gpu": "V100-16GB", "count": 2, "intra_gbps": 170, "inter_gbps": 10, "repeat": 2},
        {"name": "g4", "gpu": "T4", "count": 2, "intra_gbps": 50, "inter_gbps": 50},
    ],
    "links": [{"a": "p3-0", "b": "g4-0", "gbps": 10}],
    "gpu_types": {"X1": {"base": "T4", "memory_gb": 8}},
}

junk = st.one_of(
    st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.lists(st.integers(-5, 5), max_size=4), st.dictionaries(st.text(max_size=4),
                                                                                     st.integers(), max_size=3),
    st.lists(st.lists(st.floats(allow_nan=True), max_size=6), max_size=6),
)


@st.composite
def mutated(draw):
    spec = draw(fuzz.mutated(BASE, junk, max_edits=4))
    if draw(st.booleans()):
        n = draw(st.integers(0, 7))
        spec["bandwidth_matrix_gbps"] = draw(st.lists(
            st.lists(st.one_of(st.floats(-5, 100), st.just(float("nan")), st.just(float("inf")), st.integers(-3, 50)),
                     min_size=n, max_size=n),
            min_size=n, max_size=n))
    return spec


@settings(max_examples=1200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_specs_raise_only_input_error(spec):
    try:
        c = cluster_from_dict(spec, "fuzz.yaml")
    except InputError as e:
        assert "fuzz.yaml" in str(e) and "\n" not in str(e)
    else:
        assert c.size >= 1
