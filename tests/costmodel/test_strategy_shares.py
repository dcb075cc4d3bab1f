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
