"""Per-layer profile CSV rows: what ``ampe profile`` writes and ``--profile`` readers take (reference:
docs/reference/profile_csv.md). Both sides use :class:`ProfileRow`.

Columns ``model,device,tp,mbs,layer,forward_s[,backward_s][,layer_kind][,memory_bytes][,attention][,recompute]``
``[,forward_j,backward_j][,sm_clock_mhz]``;
other columns are allowed and ignored. Times are seconds for one micro-batch of ``mbs`` samples on one
tensor-parallel rank, ``memory_bytes`` the activation bytes the layer keeps for backward, joules when measured.
``attention`` is the kernel the layer ran (``eager``/``flash``; empty: the model's default), ``recompute`` the
activation recomputation it ran under (``none``/``selective``/``full``; empty: ``none``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ampe.errors import InputError

COLUMNS = ("model", "device", "tp", "mbs", "layer", "forward_s", "backward_s", "layer_kind", "memory_bytes",
           "attention", "recompute")
ENERGY_COLUMNS = ("forward_j", "backward_j")
CLOCK_COLUMNS = ("sm_clock_mhz",)  # rows measured with the SM clock locked (ampe profile --clocks)
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
    sm_clock_mhz: int | None = Field(default=None, ge=1, le=10_000)  # None: the GPU's default clock behaviour
    attention: Attention | None = None  # None: the model's default kernel (older profiles)
    recompute: Recompute | None = None  # None: none (older profiles)

    @property
    def recompute_mode(self) -> str:
        """The recomputation the row was measured under (``none`` where the column is empty)."""
        return self.recompute or "none"

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
