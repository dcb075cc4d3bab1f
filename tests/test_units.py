"""``ampe.units``: the one formatter of energies and powers — SI prefixes, never an exponent."""

from __future__ import annotations

import math
import re

import pytest

from ampe.units import si, si_scale


@pytest.mark.parametrize(("value", "unit", "text"), [
    (537_800.0, "J", "537.8 kJ"),  # the 5.378e+05 J
    (11_090.0, "W", "11.09 kW"),  # and its 1.109e+04 W
    (2.836, "J", "2.836 J"),
    (28.11, "W", "28.11 W"),
    (0.004, "J", "4 mJ"),
    (3.6e9, "J", "3.6 GJ"),
    (-1234.0, "J", "-1.234 kJ"),
    (0.0, "J", "0 J"),
    (999_960.0, "J", "1 MJ"),  # 999.96 kJ rounds to 1000 kJ: the next prefix
    (999.96, "W", "1 kW"),
])
def test_si_prefixes(value, unit, text):
    assert si(value, unit) == text


def test_si_never_prints_an_exponent_and_reads_back_to_four_digits():
    prefix = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18, "m": 1e-3, "µ": 1e-6}
    for exp in range(-5, 19):
        for mantissa in (1.0, 1.2345, 4.567, 9.9994, 9.99951):
            v = mantissa * 10.0 ** exp
            text = si(v, "J")
            assert "e" not in text.split(" ")[0], text
            number, unit = text.split(" ")
            assert unit.endswith("J") and 1 <= abs(float(number)) < 1000, text
            assert math.isclose(float(number) * prefix[unit[:-1]], v, rel_tol=6e-4), (v, text)


def test_si_keeps_non_finite_values_visible():
    assert si(float("nan"), "J") == "nan J" and si(float("inf"), "W") == "inf W"


def test_si_scale_picks_one_prefix_for_a_column():
    assert si_scale([2492.0, 2304.0, 150.0], "J") == (1e3, "kJ")
    assert si_scale([0.5, 0.2], "J") == (1e-3, "mJ")
    assert si_scale([], "W") == (1.0, "W") and si_scale([0.0, float("nan")], "W") == (1.0, "W")


def test_the_search_and_report_tables_print_no_exponent(run_cli):
    """The issue's complaint, end to end: a Llama-3.1-8B plan on the A100/A40 cluster (10⁵ J per iteration)."""
    from tests.conftest import SPECS

    code, out, err = run_cli("search", "--cluster", SPECS / "mixed-a100-a40.yaml", "--model", "llama-3.1-8b",
                             "--top-k", "3", "--iterations", "1000")
    assert code == 0, err
    assert not re.search(r"\d\.\d+e[+-]\d\d", out), out
    assert " kJ " in out and " kW " in out and " kWh " in out
