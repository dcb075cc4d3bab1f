"""Property test: randomly mutated specs never escape the loader as anything but InputError."""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampe.costmodel.cluster import cluster_from_dict
from ampe.errors import InputError

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


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*prefix, i))


PATHS = [p for p in _paths(BASE) if p]


@st.composite
def mutated(draw):
    spec = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(PATHS))
        target = spec
        try:
            for part in path[:-1]:
                target = target[part]
            action = draw(st.sampled_from(["replace", "delete", "add"]))
            if action == "replace":
                target[path[-1]] = draw(junk)
            elif action == "delete":
                del target[path[-1]]
            elif isinstance(target, dict):
                target[draw(st.text(max_size=6))] = draw(junk)
            else:
                target.append(draw(junk))
        except (KeyError, IndexError, TypeError, AttributeError):
            pass
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
