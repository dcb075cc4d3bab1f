"""The cost model's caches, in one place: what a search keeps across the strategies it costs.

A :class:`~ampe.costmodel.estimate.CostModel` is built once per (cluster, model, profile) and costs thousands of
strategies; most of their terms repeat (the same per-layer tables, the same device maps for the partitions of one
candidate, the same stage sums). :class:`CostCaches` holds every such table with a typed key; the bounded ones are
:class:`BoundedCache`\\ s (the oldest entry goes when full, or all of them for the large caches of cheap entries).
Nothing here changes a result: a cache hit returns what the computation would (the tests in
``tests/costmodel/test_vectorised.py`` hold the cached arithmetic to the plain one).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, fields
from typing import Any, Generic, Literal, NamedTuple, TypeVar

import numpy as np

from ampe.costmodel.compute import LayerTimes
from ampe.costmodel.layout import DeviceLayout
from ampe.costmodel.memory import StageMemory
from ampe.costmodel.strategy import Strategy

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_MISSING: Any = object()

RECENT = 16  # CostCaches.recent entries kept
LAYOUTS = 8  # device maps kept: a candidate's stage tables and re-costed partitions use the same one
SEGMENTS = 200_000  # (layer times, first, last) sums kept (about 50 MB at most)
TIMINGS = 8  # iteration_time's terms kept for the estimate that may follow (the search re-costs a few)
STAGE_MEMORY = 200_000  # (strategy, stage, chunk, GPU type) memory breakdowns kept (about 60 MB)


class BoundedCache(Generic[K, V]):
    """A mapping of at most ``limit`` entries. When full, a new entry drops the oldest one (``evict="oldest"``:
    first in, first out) or every entry (``evict="all"``: for large caches of entries that are cheap to remake,
    where dropping the oldest one by one would cost more than it saves)."""

    def __init__(self, limit: int, evict: Literal["oldest", "all"] = "oldest") -> None:
        if limit < 1:
            raise ValueError(f"a cache holds at least one entry, got limit {limit}")
        self.limit = limit
        self.evict = evict
        self._data: dict[K, V] = {}
        # The value held for a key, or None: the dict's own lookup (a hot path of the search: no Python frame).
        self.get: Callable[[K], V | None] = self._data.get

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def put(self, key: K, value: V) -> V:
        """Hold ``value`` for ``key`` (making room first when full); returns ``value``."""
        if key not in self._data and len(self._data) >= self.limit:
            if self.evict == "all":
                self._data.clear()
            else:
                self._data.pop(next(iter(self._data)))
        self._data[key] = value
        return value

    def get_or_make(self, key: K, make: Callable[[], V]) -> V:
        """The value held for ``key``, else ``make()`` held and returned."""
        hit = self._data.get(key, _MISSING)
        return self.put(key, make()) if hit is _MISSING else hit


class LayerTimesKey(NamedTuple):
    """Per-layer times of one GPU type at (tp, mbs) over a tensor-parallel ring of ``tp_bandwidth`` bytes/s, under
    one recomputation."""

    gpu: str
    tp: int
    mbs: int
    tp_bandwidth: float
    recompute: str


class SegmentKey(NamedTuple):
    """Forward and backward sums of layers ``first``..``last``-1 under the layer times of ``times``."""

    times: LayerTimesKey
    first: int
    last: int


class LayoutKey(NamedTuple):
    """Degrees and placement: what a strategy's device maps depend on."""

    pp: int
    dp: int
    tp: int
    placement: tuple[int, ...]


class StageMemoryKey(NamedTuple):
    """One tensor-parallel rank of a device stage: the strategy's :func:`degrees_key` (its memory options included),
    the stage, its chunks (first, last) and the GPU type."""

    degrees: tuple
    stage: int
    chunks: tuple[tuple[int, int], ...]
    gpu: str


class TimingKey(NamedTuple):
    """A completed strategy and the pipeline method it was timed with."""

    strategy: Strategy
    method: str


def degrees_key(s: Strategy) -> tuple:
    """Every field of ``s`` but its partition and placement, as a plain tuple: a cache key for terms that depend on
    the degrees and schedule, not on where devices sit or how layers are cut."""
    return tuple(getattr(s, f) for f in _DEGREE_FIELDS)


_DEGREE_FIELDS = tuple(f.name for f in fields(Strategy) if f.name not in ("partition", "placement"))


@dataclass(eq=False)
class CostCaches:
    """Every table one cost model keeps across strategies. The per-layer tables (``times``, ``states``, ``acts``,
    ``params``) and :meth:`cached` are few (one entry per GPU type and degrees) and kept whole; the rest are
    bounded."""

    times: dict[LayerTimesKey, LayerTimes] = field(default_factory=dict)
    states: dict[tuple[int, int, int], np.ndarray] = field(default_factory=dict)  # (tp, zero, dp) → (L,) bytes
    acts: dict[tuple[str, int, int, str], np.ndarray] = field(default_factory=dict)  # (gpu, tp, mbs, rec) → bytes
    params: dict[tuple[int, int, int], float] = field(default_factory=dict)  # (first, last, tp) → trainable params
    layouts: BoundedCache[LayoutKey, DeviceLayout] = field(default_factory=lambda: BoundedCache(LAYOUTS))
    stage_types: BoundedCache[LayoutKey, tuple[tuple[int, ...], ...]] = field(
        default_factory=lambda: BoundedCache(LAYOUTS))
    segments: BoundedCache[SegmentKey, tuple[float, float]] = field(
        default_factory=lambda: BoundedCache(SEGMENTS, "all"))
    stage_memory: BoundedCache[StageMemoryKey, tuple[StageMemory, int]] = field(  # (breakdown, total bytes)
        default_factory=lambda: BoundedCache(STAGE_MEMORY, "all"))
    # → the time terms of CostModel.iteration_time (ampe.costmodel.estimate's Timing)
    timings: BoundedCache[TimingKey, Any] = field(default_factory=lambda: BoundedCache(TIMINGS))
    _memo: dict[tuple, Any] = field(default_factory=dict)
    _recent: BoundedCache[tuple, Any] = field(default_factory=lambda: BoundedCache(RECENT))

    def cached(self, key: tuple, make: Callable[[], Any]) -> Any:
        """``make()``, computed once per key (tables that depend on the model and degrees only, shared by every
        candidate; keys start with the table's name; keep them to a few thousand)."""
        hit = self._memo.get(key, _MISSING)
        if hit is _MISSING:
            hit = self._memo[key] = make()
        return hit

    def cached_value(self, key: tuple) -> Any:
        """What :meth:`cached` holds for ``key``, or None when nothing is held yet (lets a caller build several
        missing entries together)."""
        return self._memo.get(key)

    def recent(self, key: tuple, make: Callable[[], Any]) -> Any:
        """``make()``, kept for the last :data:`RECENT` keys only (terms one candidate reuses a few times, too many
        over a search to keep them all)."""
        return self._recent.get_or_make(key, make)
