"""Measured per-layer profiles (CSV) that override the analytic compute model.

CSV contract (extra columns are allowed and ignored)::

    model,device,tp,mbs,layer,forward_s[,backward_s][,layer_kind][,memory_bytes][,attention][,recompute]

* ``device`` is a catalog GPU name (or one a cluster spec defines); ``layer`` is the 0-based LayerSpec index.
* ``forward_s``/``backward_s`` are seconds for one *micro-batch* of ``mbs`` samples on one tensor-parallel rank,
  tensor-parallel communication included (it was measured at that ``tp``). A missing or empty ``backward_s`` means
  2 × forward.
* ``memory_bytes`` (optional) is the activation memory the layer keeps for backward for one micro-batch.
* ``attention`` (optional) is the attention kernel the row was measured with, ``eager`` or ``flash``; empty means the
  model's default kernel (:func:`default_attention`). ``recompute`` (optional) is the activation recomputation it
  ran under, ``none``, ``selective`` or ``full``; empty means ``none``.

**Attention kernels.** A profile is read for one model at a time (:meth:`Profile.for_model`): only the rows of that
model's attention kernel are used; rows of another kernel are left out, and :meth:`Profile.describe` says so (the
search prints it). Before that selection, the accessors see each model's rows of one kernel: its only one, else
the rows without an attention column, else eager's.

**Recomputation rows.** ``recompute = none`` rows are the layer times and activation memory; ``selective`` and
``full`` rows are what the same layer costs in a stage that recomputes (:meth:`Profile.recompute_sample`; the cost
model uses them instead of its analytic recomputation terms).

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
from ampe.costmodel.model import Model
from ampe.errors import InputError
from ampe.formats.calibration import SIDECAR_SUFFIX, CalibrationFile, CalibrationParams
from ampe.formats.profile import RECOMPUTE, REQUIRED, ProfileRow
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


Key = tuple[str, str, int, int]  # (model, device, tp, layer)
Samples = tuple[ProfileSample, ...]  # sorted by mbs
Variant = tuple[str, str | None, str]  # (model, attention kernel or None: no attention column, recompute)


@dataclass(frozen=True)
class _Rows:
    """The rows of one :data:`Variant`: default-clock samples and per-clock samples, by key."""

    table: dict[Key, Samples]
    clocked: dict[Key, dict[int, Samples]]


@dataclass(frozen=True, eq=False)
class Profile:
    """Measured layer timings keyed by (model, device, tp, layer), each a list of samples sorted by mbs: the rows of
    one attention kernel (:attr:`attention`; see the module docstring) without recomputation, plus that kernel's
    recomputation rows (:attr:`recomputed`)."""

    source: str
    table: dict[Key, Samples] = field(default_factory=dict)
    kinds: dict[tuple[str, int], str] = field(default_factory=dict)
    # The structural calibration found beside the CSV (``<csv>.calibration.json``), applied by the cost model.
    calibration: CalibrationParams | None = None
    # Rows measured with the SM clock locked (``ampe profile --clocks``): key → {MHz: samples sorted by mbs}.
    clocked: dict[Key, dict[int, Samples]] = field(default_factory=dict)
    # Rows measured under activation recomputation: "selective"/"full" → key → samples (``recompute`` column).
    recomputed: dict[str, dict[Key, Samples]] = field(default_factory=dict)
    # The attention kernel of this view's rows (:meth:`for_model`); None: as read (each model's rows of one kernel).
    attention: str | None = None
    # Every row as read, by (model, attention, recompute); empty for a profile built in memory (used as it is).
    variants: dict[Variant, _Rows] = field(default_factory=dict, repr=False)
    _views: dict[tuple[str, str], Profile] = field(default_factory=dict, repr=False)

    def for_model(self, model: Model) -> Profile:
        """This profile as the cost model of ``model`` reads it: the rows of ``model``'s attention kernel (an empty
        attention column counts as the model's default kernel, :func:`default_attention`), its recomputation rows,
        and no row of another kernel. Cached; a profile built in memory (no :attr:`variants`) is returned as it is."""
        if not self.variants:
            return self
        key = (model.name, model.attention)
        hit = self._views.get(key)
        if hit is None:
            kernels: tuple[str | None, ...] = (model.attention, None) if default_attention(model) == model.attention \
                else (model.attention,)
            table, clocked = _merged(self.variants, model.name, kernels, "none")
            recomputed = {rec: _merged(self.variants, model.name, kernels, rec)[0] for rec in RECOMPUTE[1:]}
            hit = self._views[key] = Profile(
                source=self.source, table=table, kinds=self.kinds, calibration=self.calibration, clocked=clocked,
                recomputed={k: v for k, v in recomputed.items() if v}, attention=model.attention,
                variants=self.variants, _views=self._views)
        return hit

    def kernels(self, model: str) -> set[str | None]:
        """Attention kernels with rows for ``model`` (None: rows without an attention column)."""
        return {v[1] for v in self.variants if v[0] == model}

    def all_keys(self) -> set[Key]:
        """Every (model, device, tp, layer) with a row, whatever its kernel, recomputation or clock."""
        keys = set(self.table) | set(self.clocked)
        for rows in self.variants.values():
            keys |= set(rows.table) | set(rows.clocked)
        return keys

    def recompute_sample(self, model: str, device: str, tp: int, layer: int, mbs: int, recompute: str
                         ) -> ProfileSample | None:
        """The measured sample (seconds, bytes) of a layer under ``recompute`` at ``mbs`` (interpolated as
        :meth:`layer_sample`), or None where that recomputation was not measured; ``none`` is :meth:`layer_sample`."""
        if recompute == "none":
            return self.layer_sample(model, device, tp, layer, mbs)
        samples = self.recomputed.get(recompute, {}).get((model, device, tp, layer))
        return None if not samples else _at_mbs(samples, mbs)

    def recompute_modes(self, model: str, device: str, tp: int, num_layers: int) -> list[str]:
        """Recomputation modes (``none`` first) measured for every layer of ``model`` on ``device`` at ``tp``."""
        tables = [("none", self.table)] + [(r, self.recomputed.get(r, {})) for r in RECOMPUTE[1:]]
        return [r for r, t in tables if all((model, device, tp, l) in t for l in range(num_layers))]

    def describe(self, model: Model) -> tuple[str, str | None]:
        """(what the cost model of ``model`` takes from this profile, one line; a warning line about rows it leaves
        out — another attention kernel's — or None). ``self`` should be :meth:`for_model`'s view."""
        view = self.for_model(model)
        n = model.num_layers
        kernel = f"{model.attention} attention"
        parts: list[str] = []
        tps_of: dict[tuple[str, str, str, str], list[int]] = {}  # equal lines but for tp are said once, tp 1,2,4
        for device in sorted(view.devices(model.name)):
            for tp in sorted(view.tps(model.name, device)):
                covered = sum((model.name, device, tp, l) in view.table for l in range(n))
                mbs = sorted({s.mbs for l in range(n) for s in view.table.get((model.name, device, tp, l), ())})
                modes = view.recompute_modes(model.name, device, tp, n) if covered == n else []
                # modes the search may plan (never selective with flash) and not measured: the analytic terms
                analytic = [r for r in RECOMPUTE if r not in modes and (r != "selective" or model.attention == "eager")]
                rec = (f"recompute {'/'.join(modes)} measured" + (f" ({'/'.join(analytic)} analytic)" if analytic
                                                                  else "")) if modes else "recompute analytic"
                layers = f"{covered}{'' if covered == n else f' of {n}'} layers of {model.name} on {device}"
                tps_of.setdefault((device, layers, ",".join(map(str, mbs)), rec), []).append(tp)
        for (_, layers, mbs_text, rec), tps in tps_of.items():
            parts.append(f"{layers} (tp {','.join(map(str, tps))}, mbs {mbs_text}), {kernel}, {rec}")
        line = (f"profile: {'; '.join(parts)}" if parts else
                f"profile: no rows of {model.name} with {kernel} in {self.source}: compute times from the roofline")
        others = sorted(k or f"{default_attention(model)} (no attention column)" for k in self.kernels(model.name)
                        if k != model.attention and not (k is None and default_attention(model) == model.attention))
        warning = None
        if others and not parts:  # only the other kernel's rows: worth a warning
            warning = (f"{self.source}: rows of {model.name} measured with {', '.join(others)} attention are not used: "
                       f"the model is planned with {kernel} (--attention picks the kernel)")
        elif others:  # a profile of both kernels: this plan reads its own
            line += f" ({', '.join(others)} attention rows left out)"
        return line, warning

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
        """Model names with at least one row (of any kernel or recomputation)."""
        return {k[0] for k in self.all_keys()}

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


def default_attention(model: Model) -> str:
    """The kernel an empty ``attention`` cell stands for: the model's default — flash for a 16-bit Llama-family model
    built from a config, eager otherwise (the GPT zoo, fp32, layer-list YAMLs)."""
    from ampe.costmodel.llama import LlamaConfig
    from ampe.costmodel.llama import default_attention as llama_default

    return llama_default(model.config.dtype) if isinstance(model.config, LlamaConfig) else "eager"


def _merged(variants: dict[Variant, _Rows], model: str, kernels: tuple[str | None, ...], recompute: str
            ) -> tuple[dict[Key, Samples], dict[Key, dict[int, Samples]]]:
    """The rows of ``model`` under ``recompute`` measured with any of ``kernels``; where two kernels (an explicit
    one and an empty column meaning the same) have a sample at the same mbs, the first kernel's wins."""
    table: dict[Key, dict[int, ProfileSample]] = defaultdict(dict)
    clocked: dict[Key, dict[int, dict[int, ProfileSample]]] = defaultdict(dict)
    for kernel in reversed(kernels):
        rows = variants.get((model, kernel, recompute))
        if rows is None:
            continue
        for k, samples in rows.table.items():
            table[k].update((s.mbs, s) for s in samples)
        for k, per in rows.clocked.items():
            for mhz, samples in per.items():
                clocked[k].setdefault(mhz, {}).update((s.mbs, s) for s in samples)
    return ({k: tuple(v[m] for m in sorted(v)) for k, v in table.items()},
            {k: {f: tuple(v[m] for m in sorted(v)) for f, v in per.items()} for k, per in clocked.items()})


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
    or two rows for the same (model, device, tp, layer, mbs, attention, recompute, clock)."""
    src = str(path)
    text = read_text(path)
    devices = set(CATALOG) | set(known_devices or ())
    table: dict[Variant, dict[Key, dict[int, ProfileSample]]] = defaultdict(lambda: defaultdict(dict))
    clocked: dict[Variant, dict[Key, dict[int, dict[int, ProfileSample]]]] = defaultdict(lambda: defaultdict(dict))
    kinds: dict[tuple[str, int], str] = {}
    for rowno, cells in csv_records(src, text, REQUIRED):
        row = ProfileRow.from_csv(cells, src, rowno)
        if row.device not in devices:
            raise InputError(src, f"row {rowno}.device", f"unknown GPU type {row.device!r}")
        variant = (row.model, row.attention, row.recompute_mode)
        key = (row.model, row.device, row.tp, row.layer)
        samples = table[variant][key] if row.sm_clock_mhz is None else \
            clocked[variant][key].setdefault(row.sm_clock_mhz, {})
        if row.mbs in samples:
            raise InputError(src, f"row {rowno}", row.slot_label())
        bwd = 2.0 * row.forward_s if row.backward_s is None else row.backward_s
        samples[row.mbs] = ProfileSample(row.mbs, row.forward_s, bwd, row.memory_bytes, row.forward_j,
                                         row.backward_j)
        if row.layer_kind:
            kinds[(row.model, row.layer)] = row.layer_kind
    if not table and not clocked:
        raise InputError(src, "", "no rows")
    variants = {}
    for v in set(table) | set(clocked):
        by_key = {k: tuple(per[m] for m in sorted(per)) for k, per in table.get(v, {}).items()}
        at_clocks = {k: {f: tuple(per[m] for m in sorted(per)) for f, per in fs.items()}
                     for k, fs in clocked.get(v, {}).items()}
        for k, per_clock in at_clocks.items():  # timing rows: the default-clock ones, else the highest clock's
            if k not in by_key:
                by_key[k] = per_clock[max(per_clock)]
        variants[v] = _Rows(by_key, at_clocks)
    # as read: each model's rows of one kernel (its only one, else the empty column's, else eager's)
    plain: dict[Key, Samples] = {}
    plain_clocked: dict[Key, dict[int, Samples]] = {}
    recomputed: dict[str, dict[Key, Samples]] = {}
    for name in sorted({v[0] for v in variants}):
        found = {v[1] for v in variants if v[0] == name}
        kernel = next(iter(found)) if len(found) == 1 else None if None in found else \
            "eager" if "eager" in found else sorted(k for k in found if k)[0]
        for rec in RECOMPUTE:
            rows = variants.get((name, kernel, rec))
            if rows is None:
                continue
            if rec == "none":
                plain.update(rows.table)
                plain_clocked.update(rows.clocked)
            else:
                recomputed.setdefault(rec, {}).update(rows.table)
    return Profile(source=src, table=plain, kinds=kinds, calibration=_sidecar(src), clocked=plain_clocked,
                   recomputed=recomputed, variants=variants)


def _sidecar(csv_path: str) -> CalibrationParams | None:
    """The calibration written beside a calibrated profile (``ampe report --calibrate``), if there is one."""
    side = Path(csv_path + SIDECAR_SUFFIX)
    if not exists(side):
        return None
    return CalibrationFile.parse(read_json(side), str(side)).params
