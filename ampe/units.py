"""Quantities for people: one formatter for every energy and power figure ampe prints or plots.

``si(537800, "J")`` is ``"537.8 kJ"`` and ``si(11090, "W")`` is ``"11.09 kW"``: four significant digits, an SI prefix
from milli to exa chosen so that the number lies in [1, 1000), never an exponent. :func:`si_scale` picks one prefix for
a whole axis or column (the largest value's), so figures that are compared share a unit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

PREFIXES = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""), (1e-3, "m"),
            (1e-6, "µ"))


def _prefix(magnitude: float) -> tuple[float, str]:
    """The largest prefix whose factor is ≤ ``magnitude`` (the smallest one below it; none for 0)."""
    if magnitude == 0 or not math.isfinite(magnitude):
        return 1.0, ""
    for scale, name in PREFIXES:
        if magnitude >= scale:
            return scale, name
    return PREFIXES[-1]


def si(value: float, unit: str, digits: int = 4) -> str:
    """``value`` (in ``unit``: J, W, …) with an SI prefix and ``digits`` significant digits: ``"537.8 kJ"``.

    Non-finite values print as they are (``"nan J"``)."""
    if not math.isfinite(value):
        return f"{value} {unit}"
    scale, name = _prefix(abs(value))
    shown = float(f"{value / scale:.{digits}g}")
    if abs(shown) >= 1000 and scale < PREFIXES[0][0]:  # 999.96 kJ rounds to 1000 kJ: say 1 MJ
        scale, name = scale * 1000, next(n for s, n in PREFIXES if s == scale * 1000)
        shown = float(f"{value / scale:.{digits}g}")
    return f"{shown:.{digits}g} {name}{unit}"


def si_scale(values: Iterable[float], unit: str) -> tuple[float, str]:
    """One prefix for a set of figures (an axis, a column): ``(factor, "kJ")`` from the largest magnitude; divide the
    values by ``factor``. ``(1.0, unit)`` when there is no finite non-zero value."""
    finite = [abs(v) for v in values if math.isfinite(v) and v != 0]
    scale, name = _prefix(max(finite)) if finite else (1.0, "")
    return scale, f"{name}{unit}"


__all__ = ["si", "si_scale"]
