"""Uneven data-parallel shares on the strategy: parsing, validation and the round trip through a plan entry."""

import pytest

from ampe.costmodel.strategy import strategy_from_dict, validate, with_shares
from ampe.errors import InputError


def test_shares_make_the_global_batch_and_round_trip() -> None:
    s = strategy_from_dict({"pp": 2, "dp": 2, "tp": 1, "mbs": 2, "replica_gas": [3, 1]})
    assert s.gbs == 8 and s.shares == (3, 1) and s.gas == 3 and s.uneven
    assert strategy_from_dict(s.to_dict()) == s
    assert validate(s, 4, 8).replica_gas == (3, 1)


def test_equal_shares_read_as_before() -> None:
    s = strategy_from_dict({"pp": 1, "dp": 2, "tp": 1, "mbs": 1, "replica_gas": [2, 2]})
    assert s.replica_gas is None and s.gbs == 4 and s.shares == (2, 2)
    assert with_shares(s, (3, 1)).gbs == 4 and with_shares(s, (1, 1)).replica_gas is None


@pytest.mark.parametrize(("extra", "field"), [
    ({"replica_gas": [3]}, "replica_gas"), ({"replica_gas": [3, 0]}, "replica_gas"),
    ({"replica_gas": [3, True]}, "replica_gas"), ({"replica_gas": [3, 1], "gbs": 9}, "replica_gas"),
    ({"replica_gas": [3, 1], "gas": 2}, "gas"),
])
def test_bad_shares_name_the_field(extra: dict[str, object], field: str) -> None:
    with pytest.raises(InputError) as err:
        strategy_from_dict({"pp": 1, "dp": 2, "tp": 1, "mbs": 2, **extra})
    assert err.value.field == field


def test_deepspeed_config_under_uneven_shares_passes_deepspeeds_batch_check() -> None:
    """DeepSpeed requires train_batch_size = micro·gas·dp of each rank's config: the plan's config is the largest
    share's, each replica's its own (both pass), and equal shares keep gbs."""
    from ampe.costmodel.training import deepspeed_config, replica_deepspeed_config

    s = strategy_from_dict({"pp": 1, "dp": 2, "tp": 1, "mbs": 2, "replica_gas": [5, 3]})
    for cfg in (deepspeed_config(s, "fp32"), *(replica_deepspeed_config(s, r, "fp32") for r in range(2))):
        assert cfg["train_batch_size"] == (cfg["train_micro_batch_size_per_gpu"]
                                           * cfg["gradient_accumulation_steps"] * s.dp)
    assert [replica_deepspeed_config(s, r, "fp32")["gradient_accumulation_steps"] for r in range(2)] == [5, 3]
    equal = strategy_from_dict({"pp": 1, "dp": 2, "tp": 1, "mbs": 2, "gbs": 16})
    assert deepspeed_config(equal, "fp32")["train_batch_size"] == 16


def test_interleaved_shares_in_units_of_pp_only_with_virtual_stages() -> None:
    """The validator and the share choice agree: multiples of pp only where the interleaved schedule has chunks."""
    base = {"pp": 2, "dp": 2, "tp": 1, "mbs": 1, "schedule": "interleaved", "replica_gas": [3, 1]}
    assert validate(strategy_from_dict(base), 4, 8).replica_gas == (3, 1)  # one chunk per device: no unit
    with pytest.raises(InputError, match="multiple of pp"):
        validate(strategy_from_dict({**base, "virtual_stages": 2}), 4, 8)
