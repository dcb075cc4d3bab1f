"""The base model and scalar types every file format shares."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict, ValidationError

from ampe.errors import UNKNOWN_KEY, InputError, field_path, pydantic_first
from ampe.plausible import CLOCK_MHZ, ITERATION_S

MAX_MHZ = int(CLOCK_MHZ.hi)  # no accelerator clocks above this; a typo such as 1e9 MHz is refused

# Strict scalars: a boolean is not a number and "8" is not an integer; NaN/Infinity are refused by the config.
PositiveInt = Annotated[int, Strict(), Field(ge=1)]
NonNegativeInt = Annotated[int, Strict(), Field(ge=0)]
NonNegativeFloat = Annotated[float, Strict(), Field(ge=0)]
PositiveFloat = Annotated[float, Strict(), Field(gt=0)]
Mhz = Annotated[int, Strict(), Field(ge=1, le=MAX_MHZ)]
Text = Annotated[str, Strict(), Field(max_length=4096)]
Flag = Annotated[bool, Strict()]
# seconds per training iteration, predicted or measured, within ampe.plausible.ITERATION_S (1 µs to 11.6 days)
IterationSeconds = Annotated[float, Strict(), AfterValidator(ITERATION_S.validate)]

M = TypeVar("M", bound="FileModel")


class FileModel(BaseModel):
    """A record of a file format: immutable, no unknown keys, finite numbers only."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @classmethod
    def parse(cls: type[M], raw: Any, source: str, where: str = "") -> M:
        """Validate parsed JSON; an :class:`InputError` names ``source`` and the first bad field (under ``where``)."""
        try:
            return cls.model_validate(raw)
        except ValidationError as e:
            errors = e.errors()
            unknown = [err for err in errors if err.get("type") == UNKNOWN_KEY]
            first = unknown[0] if unknown else errors[0]
            parts = [p for p in first.get("loc", ()) if not str(p).startswith("function-")]
            message = pydantic_first(errors, cls)[1] if unknown else _message(first)
            if first.get("type") == "value_error":  # a model validator: "FIELD: reason" names a field under here
                message = str(first.get("msg", "")).removeprefix("Value error, ")
                head, sep, rest = message.partition(": ")
                if sep and " " not in head:
                    parts, message = [*parts, head], rest
            loc = field_path(parts)
            field = f"{where}.{loc}" if where and loc != "(root)" else (where or loc)
            raise InputError(source, field, message) from None

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (optional fields left unset are omitted)."""
        return self.model_dump(mode="json", exclude_unset=True)


def _message(err: Any) -> str:
    msg = str(err.get("msg", "invalid value"))
    value = err.get("input")
    shown = repr(value)
    if isinstance(value, (dict, list)) or len(shown) > 80:
        return msg
    return f"{msg}, got {shown}"
