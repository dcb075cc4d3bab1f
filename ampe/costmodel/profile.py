"""Measured per-layer profiles (CSV) that override the analytic compute model.

CSV contract (extra columns are allowed and ignored)::

    model,device,tp,mbs,layer,forward_s[,backward_s][,layer_kind][,memory_bytes]

* ``device`` is a catalog GPU name (or one a cluster spec defines); ``layer`` is the 0-based LayerSpec index.
* ``forward_s``/``backward_s`` are seconds for one *micro-batch* of ``mbs`` samples on one tensor-parallel rank,
  tensor-parallel communication included (it was measured at that ``tp``). A missing or empty ``backward_s`` means
  2 × forward.
* ``memory_bytes`` (optional) is the activation memory the layer keeps for backward for one micro-batch.

**Unprofiled micro-batch sizes.** Between two measured sizes the time is interpolated linearly in mbs. Outside the
measured range the per-sample time of the nearest measured size is kept (time ∝ mbs), which is what AMP does with
its mbs=1 profiles; it ignores utilisation gains at larger mbs, so it is pessimistic above the range.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from ampe.costmodel.catalog import CATALOG
from ampe.errors import InputError
from ampe.formats.calibration import SIDECAR_SUFFIX, CalibrationFile, CalibrationParams
from ampe.formats.profile import REQUIRED, ProfileRow
from ampe.io import csv_records, exists, read_json, read_text


@dataclass(frozen=True)
class ProfileSample:
    """One measured point: a layer at one micro-batch size."""

    mbs: int
    forward_s: float
    backward_s: float
    memory_bytes: float | None = None
    forward_j: float | None = None  # measured energy of the forward (NVML), joules
    backward_j: float | None = None


@dataclass(frozen=True, eq=False)
class Profile:
    """Measured layer timings keyed by (model, device, tp, layer), each a list of samples sorted by mbs."""

    source: str
    table: dict[tuple[str, str, int, int], tuple[ProfileSample, ...]] = field(default_factory=dict)
    kinds: dict[tuple[str, int], str] = field(default_factory=dict)
    # The structural calibration found beside the CSV (``<csv>.calibration.json``), applied by the cost model.
    calibration: CalibrationParams | None = None
    # Rows measured with the SM clock locked (``ampe profile --clocks``): key → {MHz: samples sorted by mbs}.
    clocked: dict[tuple[str, str, int, int], dict[int, tuple[ProfileSample, ...]]] = field(default_factory=dict)

    def clocks(self, model: str, device: str, tp: int) -> list[int]:
        """SM clocks (MHz) at which every measured layer of (model, device, tp) was profiled, highest first."""
        sets = [set(v) for k, v in self.clocked.items() if k[:3] == (model, device, tp)]
        return sorted(set.intersection(*sets), reverse=True) if sets else []

    def layer_at_clock(self, model: str, device: str, tp: int, layer: int, mbs: int, mhz: int
                       ) -> ProfileSample | None:
        """A layer's sample (seconds, joules) at clock ``mhz`` and micro-batch ``mbs`` (scaled as times are)."""
        samples = self.clocked.get((model, device, tp, layer), {}).get(mhz)
        return None if not samples else _at_mbs(samples, mbs)

    def models(self) -> set[str]:
        """Model names with at least one row."""
        return {k[0] for k in self.table}

    def covers(self, model: str, device: str, tp: int, num_layers: int) -> bool:
        """True when every layer of ``model`` has a measurement on ``device`` at ``tp``."""
        return all((model, device, tp, l) in self.table for l in range(num_layers))

    def tps(self, model: str, device: str) -> set[int]:
        """Tensor-parallel degrees measured for (model, device)."""
        return {k[2] for k in self.table if k[0] == model and k[1] == device}

    def devices(self, model: str) -> set[str]:
        """Device types measured for ``model``."""
        return {k[1] for k in self.table if k[0] == model}

    def layer_time(self, model: str, device: str, tp: int, layer: int, mbs: int) -> tuple[float, float] | None:
        """(forward, backward) seconds for one micro-batch of ``mbs``, or None when not profiled."""
        samples = self.table.get((model, device, tp, layer))
        if not samples:
            return None
        s = _at_mbs(samples, mbs)
        return s.forward_s, s.backward_s

    def layer_sample(self, model: str, device: str, tp: int, layer: int, mbs: int) -> ProfileSample | None:
        """The default-clock sample (seconds, joules, bytes) of a layer at ``mbs`` (interpolated), or None."""
        samples = self.table.get((model, device, tp, layer))
        return None if not samples else _at_mbs(samples, mbs)

    @cached_property
    def has_energy(self) -> bool:
        """Whether any row carries measured energy (default clock or per clock)."""
        return any(s.forward_j is not None for v in self.table.values() for s in v) or bool(self.clocked)

    def layer_memory(self, model: str, device: str, tp: int, layer: int, mbs: int) -> float | None:
        """Measured activation bytes for one micro-batch of ``mbs`` (scaled like times), or None."""
        samples = [s for s in self.table.get((model, device, tp, layer), ()) if s.memory_bytes is not None]
        if not samples:
            return None
        return _at_mbs(tuple(samples), mbs).memory_bytes


def _at_mbs(samples: tuple[ProfileSample, ...], mbs: int) -> ProfileSample:
    """Interpolate linearly between measured mbs; outside the range keep the nearest per-sample figures."""
    sizes = [s.mbs for s in samples]
    i = bisect.bisect_left(sizes, mbs)
    if i < len(sizes) and sizes[i] == mbs:
        return samples[i]
    if i == 0 or i == len(sizes):
        near = samples[0] if i == 0 else samples[-1]
        r = mbs / near.mbs

        def scaled(v: float | None) -> float | None:
            return None if v is None else v * r

        return ProfileSample(mbs, near.forward_s * r, near.backward_s * r, scaled(near.memory_bytes),
                             scaled(near.forward_j), scaled(near.backward_j))
    lo, hi = samples[i - 1], samples[i]
    w = (mbs - lo.mbs) / (hi.mbs - lo.mbs)

    def lerp(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else a + w * (b - a)

    return ProfileSample(mbs, lerp(lo.forward_s, hi.forward_s), lerp(lo.backward_s, hi.backward_s),  # type: ignore[arg-type]
                         lerp(lo.memory_bytes, hi.memory_bytes), lerp(lo.forward_j, hi.forward_j),
                         lerp(lo.backward_j, hi.backward_j))


def load_profile(path: str | Path, known_devices: Iterable[str] | None = None) -> Profile:
    """Read a profile CSV (rows: :class:`~ampe.formats.profile.ProfileRow`). Raises :class:`InputError` naming the
    file, row and column on bad input: a malformed row, a duplicated column, a row with more cells than the header,
    or two rows for the same (model, device, tp, layer, mbs)."""
    src = str(path)
    text = read_text(path)
    devices = set(CATALOG) | set(known_devices or ())
    table: dict[tuple[str, str, int, int], dict[int, ProfileSample]] = defaultdict(dict)
    clocked: dict[tuple[str, str, int, int], dict[int, dict[int, ProfileSample]]] = defaultdict(dict)
    kinds: dict[tuple[str, int], str] = {}
    for rowno, cells in csv_records(src, text, REQUIRED):
        row = ProfileRow.from_csv(cells, src, rowno)
        if row.device not in devices:
            raise InputError(src, f"row {rowno}.device", f"unknown GPU type {row.device!r}")
        key = (row.model, row.device, row.tp, row.layer)
        samples = table[key] if row.sm_clock_mhz is None else clocked[key].setdefault(row.sm_clock_mhz, {})
        if row.mbs in samples:
            at = "" if row.sm_clock_mhz is None else f", {row.sm_clock_mhz} MHz"
            raise InputError(src, f"row {rowno}", f"a second row for model {row.model}, device {row.device}, "
                             f"tp {row.tp}, layer {row.layer}, mbs {row.mbs}{at}")
        bwd = 2.0 * row.forward_s if row.backward_s is None else row.backward_s
        samples[row.mbs] = ProfileSample(row.mbs, row.forward_s, bwd, row.memory_bytes, row.forward_j,
                                         row.backward_j)
        if row.layer_kind:
            kinds[(row.model, row.layer)] = row.layer_kind
    if not table and not clocked:
        raise InputError(src, "", "no rows")
    for key, per_clock in clocked.items():  # timing rows: the default-clock ones, else the highest clock's
        if key not in table:
            table[key] = per_clock[max(per_clock)]
    frozen = {k: tuple(v[m] for m in sorted(v)) for k, v in table.items()}
    at_clocks = {k: {f: tuple(v[m] for m in sorted(v)) for f, v in per.items()} for k, per in clocked.items()}
    return Profile(source=src, table=frozen, kinds=kinds, calibration=_sidecar(src), clocked=at_clocks)


def _sidecar(csv_path: str) -> CalibrationParams | None:
    """The calibration written beside a calibrated profile (``ampe report --calibrate``), if there is one."""
    side = Path(csv_path + SIDECAR_SUFFIX)
    if not exists(side):
        return None
    return CalibrationFile.parse(read_json(side), str(side)).params
