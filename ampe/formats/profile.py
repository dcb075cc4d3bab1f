"""Per-layer profile CSV rows: what ``ampe profile`` writes and ``--profile`` readers take (reference:
docs/reference/profile_csv.md). Both sides use :class:`ProfileRow`.

Columns ``model,device,tp,mbs,layer,forward_s[,backward_s][,layer_kind][,memory_bytes][,attention][,recompute]``
``[,forward_j,backward_j,energy_source][,sm_clock_mhz][,same_as_layer]``;
other columns are allowed and ignored. Times are seconds for one micro-batch of ``mbs`` samples on one
tensor-parallel rank, ``memory_bytes`` the activation bytes the layer keeps for backward, joules when measured.
``attention`` is the kernel the layer ran (``eager``/``flash``; empty: the model's default), ``recompute`` the
activation recomputation it ran under (``none``/``selective``/``full``; empty: ``none``).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ampe.errors import InputError
from ampe.io import csv_records, read_text

COLUMNS = ("model", "device", "tp", "mbs", "layer", "forward_s", "backward_s", "layer_kind", "memory_bytes",
           "attention", "recompute")
ENERGY_COLUMNS = ("forward_j", "backward_j", "energy_source")
CLOCK_COLUMNS = ("sm_clock_mhz",)  # rows measured with the SM clock locked (ampe profile --clocks)
SAME_AS_COLUMNS = ("same_as_layer",)  # rows repeating another layer's measurement (ampe profile --identical-layers)
#: Every column of :class:`ProfileRow`, in the order files are written; optional groups only where a row has them.
OPTIONAL_GROUPS = (ENERGY_COLUMNS, CLOCK_COLUMNS, SAME_AS_COLUMNS)
#: What makes two rows the same measurement slot (a file holds one row per slot; ``load_profile`` refuses a second).
IDENTITY = ("model", "device", "tp", "layer", "mbs", "attention", "recompute", "sm_clock_mhz")
REQUIRED = ("model", "device", "tp", "mbs", "layer", "forward_s")
ATTENTIONS = ("eager", "flash")  # ampe.costmodel.model.ATTENTIONS (formats imports nothing of the cost model)
RECOMPUTE = ("none", "selective", "full")  # ampe.costmodel.memory.RECOMPUTE
MAX_LAYERS = 100_000  # the model loaders' limit

Attention = Literal["eager", "flash"]
Recompute = Literal["none", "selective", "full"]
Seconds = Annotated[float, Field(ge=0)]
Joules = Annotated[float, Field(ge=0)]


class ProfileRow(BaseModel):
    """One measured layer at one micro-batch size on one GPU type and tensor-parallel degree."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False, str_strip_whitespace=True)

    model: str = Field(min_length=1, max_length=256)
    device: str = Field(min_length=1, max_length=256)
    tp: int = Field(ge=1, le=4096)
    mbs: int = Field(ge=1, le=1 << 20)
    layer: int = Field(ge=0, lt=MAX_LAYERS)
    forward_s: Seconds
    backward_s: Seconds | None = None  # missing: 2 × forward
    layer_kind: str | None = Field(default=None, max_length=256)
    memory_bytes: Annotated[float, Field(ge=0)] | None = None
    forward_j: Joules | None = None
    backward_j: Joules | None = None
    energy_source: str | None = Field(default=None, min_length=1, max_length=256)  # None: measured (older files)
    sm_clock_mhz: int | None = Field(default=None, ge=1, le=10_000)  # None: the GPU's default clock behaviour
    attention: Attention | None = None  # None: the model's default kernel (older profiles)
    recompute: Recompute | None = None  # None: none (older profiles)
    same_as_layer: int | None = Field(default=None, ge=0, lt=MAX_LAYERS)  # the layer whose measurement this repeats

    @property
    def recompute_mode(self) -> str:
        """The recomputation the row was measured under (``none`` where the column is empty)."""
        return self.recompute or "none"

    @property
    def slot(self) -> tuple[Any, ...]:
        """The measurement slot of the row (:data:`IDENTITY`; an empty recompute cell is ``none``)."""
        return tuple(self.recompute_mode if c == "recompute" else getattr(self, c) for c in IDENTITY)

    def slot_label(self) -> str:
        """The slot in words, for a refusal: ``a second row for model M, device D, tp 1, layer 3, mbs 2, …``."""
        return (f"a second row for model {self.model}, device {self.device}, tp {self.tp}, layer {self.layer}, "
                f"mbs {self.mbs}" + ("" if self.attention is None else f", {self.attention} attention")
                + ("" if self.recompute is None else f", recompute {self.recompute}")
                + ("" if self.sm_clock_mhz is None else f", {self.sm_clock_mhz} MHz"))

    @classmethod
    def from_csv(cls, cells: dict[str, str], source: str, rowno: int) -> ProfileRow:
        """Validate one CSV row (empty cells are missing values); InputError names ``row N.column``."""
        data = {k: v for k, v in cells.items() if v != ""}
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            first = e.errors()[0]
            col = ".".join(str(p) for p in first.get("loc", ())) or "(row)"
            shown = cells.get(col, "")
            got = f", got {shown!r}" if len(shown) <= 40 else ""
            raise InputError(source, f"row {rowno}.{col}", f"{first.get('msg', 'invalid value')}{got}") from None

    def csv_cells(self, columns: tuple[str, ...]) -> list[str]:
        """The row's cells for ``columns`` (floats with 6 significant digits, missing values empty)."""
        return [_cell(getattr(self, c)) for c in columns]


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def csv_columns(rows: Sequence[ProfileRow]) -> tuple[str, ...]:
    """The columns a file of ``rows`` is written with: :data:`COLUMNS`, then each optional group some row fills."""
    cols: tuple[str, ...] = COLUMNS
    for group in OPTIONAL_GROUPS:
        if any(getattr(r, c) is not None for r in rows for c in group):
            cols += group
    return cols


def profile_csv_text(rows: Sequence[ProfileRow], extra: Sequence[dict[str, str]] | None = None) -> str:
    """The profile CSV text of ``rows`` (:func:`csv_columns`), with ``extra[i]``'s other columns (not ProfileRow
    fields) after them, in first-seen order, for row ``i``."""
    cols = csv_columns(rows)
    others: dict[str, None] = {}
    for cells in extra or ():
        others.update(dict.fromkeys(cells))
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols + tuple(others))
    for i, r in enumerate(rows):
        more = extra[i] if extra else {}
        w.writerow(r.csv_cells(cols) + [more.get(c, "") for c in others])
    return buf.getvalue()


def merge_profile_csvs(paths: Sequence[str | Path]) -> str:
    """One profile CSV text holding the rows of every file in ``paths``, in file order, read and validated by
    ampe's CSV reader (:class:`ProfileRow`) whatever each file's column set and order: a file without energy
    columns merges with one that has them (its rows get empty cells), and columns that are not ProfileRow fields are
    carried through. A row identical to an earlier one for the same slot (:data:`IDENTITY`) is kept once; a row
    that differs from it is refused, as is a second row for one slot within one file (what ``load_profile``
    refuses too).

    Args:
        paths: profile CSV files.

    Returns:
        The merged CSV text (:func:`profile_csv_text`).

    Raises:
        InputError: naming the file, row and field of a malformed or conflicting row."""
    known = set(ProfileRow.model_fields)
    rows: list[ProfileRow] = []
    extra: list[dict[str, str]] = []
    seen: dict[tuple[Any, ...], tuple[str, int, int]] = {}  # slot → (file, row number, index in rows)
    for path in paths:
        src = str(path)
        for rowno, cells in csv_records(src, read_text(path), REQUIRED):
            row = ProfileRow.from_csv(cells, src, rowno)
            more = {k: v for k, v in cells.items() if k not in known and v != ""}
            slot = row.slot
            if slot in seen:
                first_src, first_row, i = seen[slot]
                if first_src == src or rows[i] != row or extra[i] != more:
                    raise InputError(src, f"row {rowno}.{_first_difference(rows[i], extra[i], row, more)}",
                                     f"conflicts with {first_src} row {first_row}: {row.slot_label()}")
                continue
            seen[slot] = (src, rowno, len(rows))
            rows.append(row)
            extra.append(more)
    if not rows:
        raise InputError(", ".join(map(str, paths)) or "--merge", "", "no rows to merge")
    return profile_csv_text(rows, extra)


def _first_difference(a: ProfileRow, a_more: dict[str, str], b: ProfileRow, b_more: dict[str, str]) -> str:
    """The first column where two rows for one slot differ (``(row)`` for identical rows within one file)."""
    for c in ProfileRow.model_fields:
        if getattr(a, c) != getattr(b, c):
            return c
    return next((c for c in {**a_more, **b_more} if a_more.get(c) != b_more.get(c)), "(row)")
