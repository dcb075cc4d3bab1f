"""``ampe.calibration/1``: the structural calibration written beside a calibrated profile CSV
(``OUT.csv`` → ``OUT.csv.calibration.json``) by ``ampe report --calibrate`` and read back by every ``--profile``
reader with :class:`CalibrationFile` (reference: docs/calibration.md).

The per-GPU-type compute factors and the micro-batch exponent are already applied to the CSV's rows; the sidecar
carries them for the record, and the terms a per-layer table cannot hold: the fixed seconds per pipeline instruction
of each GPU type and the achieved fraction of each link class's bandwidth.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, Strict

from ampe.formats._base import FileModel, Flag, NonNegativeFloat, NonNegativeInt, Text

CALIBRATION_SCHEMA = "ampe.calibration/1"
SIDECAR_SUFFIX = ".calibration.json"

Factor = Annotated[float, Strict(), Field(gt=0, le=1e3)]  # strict: a boolean is not a factor
TypeName = Annotated[str, Field(min_length=1, max_length=256)]


class CalibrationParams(FileModel):
    """The calibrated cost-model parameters (see :mod:`ampe.costmodel.calibration`)."""

    compute_factor: dict[TypeName, Factor] = Field(default_factory=dict, max_length=256)
    mbs_exponent: Annotated[float, Strict(), Field(ge=-1.0, le=1.0)] = 0.0
    pipeline_op_s: dict[TypeName, Annotated[float, Strict(), Field(ge=0, le=10.0)]] = Field(default_factory=dict,
                                                                                max_length=256)
    link_efficiency: dict[Literal["intra", "inter"], Factor] = Field(default_factory=dict)


class FittedParameter(FileModel):
    """One parameter: its value, the uncalibrated value, whether the measurements identified it (``fitted``: the
    selected structure moved it and the data shrank its posterior sd below half the prior's), and whether the
    structure moved it at all (``moved``; added 2026-11-26, absent in older sidecars), and, for a link efficiency,
    whether the fit holds it at its bound 1 while the measurements want it higher (``at_bound``; added 2026-11-28,
    absent in older sidecars)."""

    name: Text
    value: Annotated[float, Strict()]
    prior: Annotated[float, Strict()]
    fitted: Flag
    posterior_sd: NonNegativeFloat | None = None
    moved: Flag | None = None
    at_bound: Flag | None = None


class CandidateScore(FileModel):
    """One candidate structure's leave-one-out figures on the measured strategies: weighted and plain fractions of
    held-out pairs placed the wrong way, held-out MAPE (percent), and whether the selection could take it (no worse
    than the one time factor by both fractions)."""

    structure: Text
    discordance: Annotated[float, Strict(), Field(ge=0, le=1)]
    plain_discordance: Annotated[float, Strict(), Field(ge=0, le=1)]
    loo_mape_pct: NonNegativeFloat
    allowed: bool


class CalibrationFit(FileModel):
    """How the parameters were fitted and how well they predict (percent; Spearman ρ in [-1, 1])."""

    strategies: NonNegativeInt
    parameters: tuple[FittedParameter, ...] = Field(fail_fast=True)
    structure: Text | None = None  # which parameters moved: "scale", "scale+mbs", "compute+mbs+ops", "full"
    mape_before_pct: NonNegativeFloat | None = None
    mape_after_pct: NonNegativeFloat | None = None
    loo_mape_pct: NonNegativeFloat | None = None
    loo_spearman: Annotated[float, Strict(), Field(ge=-1, le=1)] | None = None
    spearman_before: Annotated[float, Strict(), Field(ge=-1, le=1)] | None = None
    # empty: fewer than 4 strategies
    candidates: tuple[CandidateScore, ...] = Field(default=(), max_length=16, fail_fast=True)
    # why the fit may not hold for a quiet machine (trials under host load, a factor outside its plausible range):
    # said by `ampe report --calibrate` and by every command that reads the calibrated profile
    cautions: tuple[Text, ...] = Field(default=(), max_length=16, fail_fast=True)


class CalibrationFile(FileModel):
    """The sidecar file."""

    schema_: Literal["ampe.calibration/1"] = Field(default="ampe.calibration/1", alias="schema")
    params: CalibrationParams
    fit: CalibrationFit | None = None
    base_source: Text = ""

    model_config = FileModel.model_config | {"populate_by_name": True}

    def to_json(self) -> dict:
        """JSON-ready dict with the ``schema`` key."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
