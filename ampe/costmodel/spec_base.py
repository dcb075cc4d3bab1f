"""The base of the YAML spec models (cluster, model): unknown keys, NaN/Infinity and booleans-as-numbers refused.

YAML 1.1 reads ``yes``/``true`` as booleans and pydantic would take them as 1 in a numeric field (``count: true``,
``intra_gbps: yes``); numbers written as text (``3.0e10``, which PyYAML leaves a string) stay accepted.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


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
