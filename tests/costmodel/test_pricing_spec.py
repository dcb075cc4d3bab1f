"""Prices in the cluster spec (ampe.costmodel.pricing): where each device's figures come from, what is refused, and
the one-line errors of a spec that lacks what --objective cost / carbon needs."""

from __future__ import annotations

import pytest

from ampe.costmodel.catalog import CATALOG
from ampe.costmodel.cluster import cluster_from_dict
from ampe.costmodel.pricing import J_PER_KWH, require, strategy_weights
from ampe.costmodel.strategy import Strategy
from ampe.errors import InputError


def _spec(**top):
    return {"name": "priced", **top, "nodes": [
        {"name": "a", "gpu": "A100-80GB", "count": 2, "intra_gbps": 2400, "inter_gbps": 100},
        {"name": "v", "gpu": "V100-32GB", "count": 2, "intra_gbps": 300, "inter_gbps": 100, "price_per_hour": 1.5,
         "electricity_per_kwh": 0.3, "pue": 1.5}]}


def test_node_fields_override_the_type_and_the_top_level():
    raw = _spec(currency="EUR", electricity_per_kwh=0.1, carbon_g_per_kwh=300,
                gpu_types={"A100-80GB": {"price_per_hour": 2.0}, "V100-32GB": {"price_per_hour": 9.0}})
    cl = cluster_from_dict(raw, "p.yaml")
    p = cl.pricing
    assert p is not None and p.currency == "EUR" and len(p.devices) == 4
    a, v = p.devices[0], p.devices[3]
    assert (a.price_per_hour, a.price_field) == (2.0, "gpu_types.A100-80GB.price_per_hour")
    assert (v.price_per_hour, v.price_field) == (1.5, "nodes[1].price_per_hour")  # the node's own beats the type's
    assert (a.electricity_per_kwh, a.carbon_g_per_kwh, a.pue) == (0.1, 300, 1.0)  # top level; PUE defaults to 1
    assert (v.electricity_per_kwh, v.carbon_g_per_kwh, v.pue) == (0.3, 300, 1.5)
    # a gpu_types entry with only a price keeps the catalog type itself (no variant with another DVFS source)
    assert cl.devices[0].gpu is CATALOG["A100-80GB"]
    sub = cl.subset([3, 0])
    assert sub.pricing is not None and sub.pricing.devices == (v, a)


def test_a_spec_without_prices_has_none_and_objectives_refuse_it():
    raw = _spec()
    del raw["nodes"][1]["price_per_hour"], raw["nodes"][1]["electricity_per_kwh"], raw["nodes"][1]["pue"]
    cl = cluster_from_dict(raw, "plain.yaml")
    assert cl.pricing is None
    for objective, field in (("cost", "price_per_hour"), ("carbon", "carbon_g_per_kwh")):
        with pytest.raises(InputError) as e:
            require(cl.pricing, objective, "plain.yaml")
        assert e.value.source == "plain.yaml" and e.value.field == field and objective in str(e.value)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("top,objective,field", [
    ({}, "cost", "nodes[0].price_per_hour"),  # node a has no price, neither has its type
    ({"gpu_types": {"A100-80GB": {"price_per_hour": 2.0}}}, "cost", "nodes[0].electricity_per_kwh"),
    ({"gpu_types": {"A100-80GB": {"price_per_hour": 2.0}}, "electricity_per_kwh": 0.1}, "carbon",
     "nodes[0].carbon_g_per_kwh"),
])
def test_the_first_missing_figure_is_named(top, objective, field):
    cl = cluster_from_dict(_spec(**top), "p.yaml")
    with pytest.raises(InputError) as e:
        require(cl.pricing, objective, "p.yaml")
    assert e.value.field == field


def test_zero_electricity_is_allowed_when_given():
    cl = cluster_from_dict(_spec(electricity_per_kwh=0, gpu_types={"A100-80GB": {"price_per_hour": 2.0}}), "p.yaml")
    assert require(cl.pricing, "cost", "p.yaml").devices[0].electricity_per_kwh == 0


@pytest.mark.parametrize("where,key,value", [
    ("node", "price_per_hour", -1), ("node", "pue", 0.9), ("node", "electricity_per_kwh", float("nan")),
    ("top", "carbon_g_per_kwh", -5), ("top", "pue", 11), ("type", "price_per_hour", -0.5), ("top", "currency", ""),
])
def test_bad_values_name_the_field(where, key, value):
    raw = _spec()
    if where == "node":
        raw["nodes"][0][key] = value
        field = f"nodes[0].{key}"
    elif where == "top":
        raw[key] = value
        field = key
    else:
        raw["gpu_types"] = {"A100-80GB": {key: value}}
        field = f"gpu_types.A100-80GB.{key}"
    with pytest.raises(InputError) as e:
        cluster_from_dict(raw, "bad.yaml")
    assert e.value.field == field


def test_weights_of_a_strategy_by_hand():
    raw = _spec(electricity_per_kwh=0.1, carbon_g_per_kwh=300, gpu_types={"A100-80GB": {"price_per_hour": 2.0}})
    cl = cluster_from_dict(raw, "p.yaml")
    # pp 2, dp 1, tp 2: stage 0 on the A100s (0, 1), stage 1 on the V100s (2, 3)
    s = Strategy(2, 1, 2, 1, 4, placement=(0, 1, 2, 3))
    w = strategy_weights(cl.pricing, s, "cost")
    assert w.per_second == pytest.approx((2 * 2.0 + 2 * 1.5) / 3600)
    assert w.per_joule == ((pytest.approx(0.1 * 1.0 / J_PER_KWH), pytest.approx(0.3 * 1.5 / J_PER_KWH)),)
    c = strategy_weights(cl.pricing, s, "carbon")
    assert c.per_second == 0 and c.per_joule[0][1] == pytest.approx(300 * 1.5 / J_PER_KWH)
    assert w.uniform(0) is None
    # a strategy on the A100s only rents and powers them alone
    one = strategy_weights(cl.subset([0, 1]).pricing, Strategy(1, 2, 1, 1, 4, placement=(0, 1)), "cost")
    assert one.per_second == pytest.approx(2 * 2.0 / 3600) and one.uniform(1) == pytest.approx(0.1 / J_PER_KWH)
