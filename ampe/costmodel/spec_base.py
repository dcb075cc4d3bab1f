"""The base of the YAML spec models (cluster, model): unknown keys, NaN/Infinity and booleans-as-numbers refused.

YAML 1.1 reads ``yes``/``true`` as booleans and pydantic would take them as 1 in a numeric field (``count: true``,
``intra_gbps: yes``); numbers written as text (``3.0e10``, which PyYAML leaves a string) stay accepted.
"""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, model_validator

from ampe.plausible import (
    BANDWIDTH_GBPS,
    CARBON_G_PER_KWH,
    CLOCK_MHZ,
    ENERGY_PRICE,
    EXTRA_MEMORY_GB,
    LATENCY_US,
    MEMORY_BANDWIDTH_GBS,
    MEMORY_GB,
    OVERHEAD_S,
    POWER_W,
    PRICE_PER_HOUR,
    PUE,
    TFLOPS,
)


class SpecModel(BaseModel):
    """A mapping of a YAML spec: strict about what is a number."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _booleans_are_not_numbers(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for name, field in cls.model_fields.items():
            if isinstance(out.get(name), bool) and not _admits_bool(field.annotation):
                out[name] = str(out[name]).lower()  # fails that field's number parsing, which names it
        return out


def _admits_bool(annotation: Any) -> bool:
    if annotation is bool:
        return True
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return any(_admits_bool(a) for a in typing.get_args(annotation))
    return False


# pydantic field types holding one quantity of ampe.plausible (the error message is the range in words); here, not
# there, so that reading a range imports no pydantic (`ampe frontier --profile` starts without it)
Gbps = Annotated[float, AfterValidator(BANDWIDTH_GBPS.validate)]
GBps = Annotated[float, AfterValidator(MEMORY_BANDWIDTH_GBS.validate)]
Microseconds = Annotated[float, AfterValidator(LATENCY_US.validate)]
Tflops = Annotated[float, AfterValidator(TFLOPS.validate)]
MemoryGB = Annotated[float, AfterValidator(MEMORY_GB.validate)]
ExtraMemoryGB = Annotated[float, AfterValidator(EXTRA_MEMORY_GB.validate)]
Watts = Annotated[float, AfterValidator(POWER_W.validate)]
Mhz = Annotated[float, AfterValidator(CLOCK_MHZ.validate)]
OverheadS = Annotated[float, AfterValidator(OVERHEAD_S.validate)]
PricePerHour = Annotated[float, AfterValidator(PRICE_PER_HOUR.validate)]
EnergyPrice = Annotated[float, AfterValidator(ENERGY_PRICE.validate)]
CarbonIntensity = Annotated[float, AfterValidator(CARBON_G_PER_KWH.validate)]
Pue = Annotated[float, AfterValidator(PUE.validate)]


REFERENCE_FORBIDDEN = ":,="  # what references are made of: `p3-1:2`, `--without a,b`, `--slow a=2`


def _printable(v: str) -> str:
    """A name ampe prints: no control character (a line break, an ANSI escape's ESC), no blank ends."""
    if not v.isprintable():
        bad = next(c for c in v if not c.isprintable())
        raise ValueError(f"holds the unprintable character {bad!r}; names are printed and must be plain text")
    if v != v.strip():
        raise ValueError("starts or ends with a blank")
    return v


def _reference(v: str) -> str:
    """A name other inputs refer to (a node, a node group): printable, and none of ``:``, ``,``, ``=`` nor a blank,
    which the references themselves are written with (a node ``a:1`` could never be named)."""
    _printable(v)
    bad = next((c for c in v if c in REFERENCE_FORBIDDEN or c.isspace()), None)
    if bad is not None:
        raise ValueError(f"holds {bad!r}, which references to it are written with (p3-1:2, a,b, a=2); use letters, "
                         "digits, - _ . and the like")
    return v


PrintableName = Annotated[str, AfterValidator(_printable)]  # cluster, currency, model names: printed
ReferenceName = Annotated[str, AfterValidator(_reference)]  # node group names: referred to by down, --without ...
