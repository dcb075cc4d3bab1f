"""Inputs and outputs of the layer-to-stage assignment: per-stage cost arrays in, a partition and its costs out.

This module knows nothing of clusters or models. A caller (the search, or the AMP-compatibility model) turns a
candidate strategy into prefix-sum arrays; the solvers in this package only see numbers.

Conventions (L layers, pp stages in a fixed order, stage j owns layers ``partition[j] .. partition[j+1]-1``):

* ``time_prefix[j, c]``: seconds of layers ``0..c-1`` on stage j's devices (forward + backward of one micro-batch).
  Stage j's time for layers a..b-1 is ``time_prefix[j, b] - time_prefix[j, a]``; rows may differ per stage
  (heterogeneous GPU types, tensor-parallel degrees).
* ``transfer[j, c]``: seconds charged for boundary j (stage j → j+1) when stage j+1 starts at layer c, i.e. the cut
  sits before layer c. Only columns 1..L-1 are ever read. ``+inf`` forbids that cut.
* ``mem_prefix``/``mem_capacity`` (bytes): stage j fits iff ``mem_prefix[j, b] - mem_prefix[j, a] <= mem_capacity[j]``.
  ``memory``: more bounds a stage must meet, each a term by its first layer, one by its end and its layers' largest
  working set (:class:`~ampe.costmodel.bounds.MemoryBound`, numbers only: the search's tables give the estimate's
  peak so).
  ``memory_bounds``: all of them, the first from ``mem_prefix``/``mem_capacity`` when given.
* ``sync_prefix[j, c]``: seconds of stage j's data-parallel gradient all-reduce, additive over layers.
* ``sync_once[j]``: seconds added to stage j's tail when its layers have any sync work (``sync_prefix`` difference
  > 0): e.g. an all-reduce's latency, paid only by a stage with parameters.
* ``stage_s[j]`` / ``sync_s[j]``: seconds added to stage j's time / tail whatever its layers (per-instruction and
  per-iteration overheads of the stage's device).
* ``options``: other ways to run a stage (e.g. with activation recomputation), each with its own ``time_prefix``
  and memory bounds (``mem_prefix``/``mem_capacity``, ``memory``). Option 0 is the arrays above. Every stage
  independently takes the fastest option under which it fits (the lowest index on ties; option 0 when none fits),
  so a stage's time is ``min_o {t_o(a, b) : stage (a, b) meets o's bounds}``: still a function of the stage's own
  layers, so the DP stays exact.

Objectives (AMP Eq. 4/5, with t_j stage times, e_j boundary transfers, y_j stage syncs)::

    eq5  = (gas - 1) * max_j t_j + sum_j t_j + sum_j e_j
    full = eq5 + max_j y_j

With ``blocking`` (transfers that hold both stages they join, as DeepSpeed's 1F1B runs them) the bottleneck is what
a stage is held per micro-batch, its time and both of its boundaries' transfers::

    eq5  = (gas - 1) * max_j (t_j + e_{j-1} + e_j) + sum_j t_j + sum_j e_j
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ampe.costmodel.bounds import MemoryBound

PARTITION_OBJECTIVES = ("full", "eq5")


@dataclass(frozen=True, eq=False)
class StageOption:
    """Another way to run the stages (e.g. with activation recomputation): per-layer times and memory of its own
    (no memory bound at all: every segment fits)."""

    time_prefix: np.ndarray  # (pp, L+1) seconds
    mem_prefix: np.ndarray | None = None  # (pp, L+1) bytes
    mem_capacity: np.ndarray | None = None  # (pp,) bytes
    memory: tuple[MemoryBound, ...] = ()  # more bounds (pp rows), all to be met

    @cached_property
    def memory_bounds(self) -> tuple[MemoryBound, ...]:
        """Every bound a stage under this option must meet."""
        return _bounds(self.mem_prefix, self.mem_capacity, self.memory)


@dataclass(frozen=True, eq=False)
class StageCosts:
    """Cost arrays of one candidate (see the module docstring for units and indexing)."""

    time_prefix: np.ndarray  # (pp, L+1) seconds
    transfer: np.ndarray | None  # (pp-1, L+1) seconds; None = free cuts
    gas: int  # micro-batches per pipeline per iteration
    mem_prefix: np.ndarray | None = None  # (pp, L+1) bytes
    mem_capacity: np.ndarray | None = None  # (pp,) bytes
    sync_prefix: np.ndarray | None = None  # (pp, L+1) seconds
    stage_s: np.ndarray | None = None  # (pp,) seconds added to every stage time
    sync_s: np.ndarray | None = None  # (pp,) seconds added to every stage tail (only with sync_prefix)
    options: tuple[StageOption, ...] = ()  # alternatives to option 0 (the arrays above), chosen per stage
    sync_once: np.ndarray | None = None  # (pp,) seconds added to a tail with any sync work (only with sync_prefix)
    blocking: bool = False  # transfers hold both stages they join: the bottleneck counts them (module docstring)
    memory: tuple[MemoryBound, ...] = ()  # more memory bounds (pp rows), all to be met (module docstring)

    @cached_property
    def memory_bounds(self) -> tuple[MemoryBound, ...]:
        """Every memory bound a stage (under option 0) must meet: ``mem_prefix``/``mem_capacity`` and ``memory``."""
        return _bounds(self.mem_prefix, self.mem_capacity, self.memory)

    @property
    def transfer_s(self) -> np.ndarray:
        """(pp-1, L+1) transfer seconds (``transfer`` after validation: None became zeros)."""
        assert self.transfer is not None
        return self.transfer

    def __post_init__(self) -> None:
        tp = np.array(self.time_prefix, dtype=float)  # copies: the arrays are frozen below
        if tp.ndim != 2 or tp.shape[0] < 1 or tp.shape[1] < 2:
            raise ValueError(f"time_prefix must be (pp, L+1) with pp ≥ 1, L ≥ 1; got shape {tp.shape}")
        pp, n = tp.shape
        raw = np.zeros((pp - 1, n)) if self.transfer is None else self.transfer
        tr = np.atleast_2d(np.array(raw, dtype=float)) if pp > 1 else np.zeros((0, n))
        if tr.shape != (pp - 1, n):
            raise ValueError(f"transfer must be (pp-1, L+1) = {(pp - 1, n)}, got {tr.shape}")
        if not np.all(np.isfinite(tp)):
            raise ValueError("time_prefix must be finite")
        if np.any(np.isnan(tr)) or np.any(tr == -np.inf):
            raise ValueError("transfer must be a number or +inf (forbidden cut)")
        if not isinstance(self.gas, (int, np.integer)) or self.gas < 1:
            raise ValueError(f"gas must be a positive integer, got {self.gas!r}")
        object.__setattr__(self, "time_prefix", tp)
        object.__setattr__(self, "transfer", tr)
        if (self.mem_prefix is None) != (self.mem_capacity is None):
            raise ValueError("give both mem_prefix and mem_capacity, or neither")
        if self.mem_prefix is not None:
            mp, cap = _checked_prefix(self.mem_prefix, self.mem_capacity, pp, n, "")
            object.__setattr__(self, "mem_prefix", mp)
            object.__setattr__(self, "mem_capacity", cap)
        object.__setattr__(self, "memory", tuple(_checked_bound(b, pp, n, f"memory[{i}]")
                                                 for i, b in enumerate(self.memory)))
        if self.sync_prefix is not None:
            sp = np.array(self.sync_prefix, dtype=float)
            if sp.shape != (pp, n) or not np.all(np.isfinite(sp)):
                raise ValueError(f"sync_prefix must be finite with shape {(pp, n)}, got {sp.shape}")
            object.__setattr__(self, "sync_prefix", sp)
        for name in ("stage_s", "sync_s", "sync_once"):
            raw_const = getattr(self, name)
            if raw_const is not None:
                const = np.array(raw_const, dtype=float).reshape(-1)
                if const.shape != (pp,) or not np.all(np.isfinite(const)) or np.any(const < 0):
                    raise ValueError(f"{name} must be {pp} finite seconds ≥ 0, got {const}")
                object.__setattr__(self, name, const)
        if (self.sync_s is not None or self.sync_once is not None) and self.sync_prefix is None:
            raise ValueError("sync_s and sync_once need sync_prefix")
        opts = []
        for i, o in enumerate(self.options):
            ot = np.array(o.time_prefix, dtype=float)
            if ot.shape != (pp, n) or not np.all(np.isfinite(ot)):
                raise ValueError(f"options[{i}]: time_prefix must be finite with shape {(pp, n)}, got {ot.shape}")
            ot.setflags(write=False)
            om = oc = None
            if (o.mem_prefix is None) != (o.mem_capacity is None):
                raise ValueError(f"options[{i}]: give both mem_prefix and mem_capacity, or neither")
            if o.mem_prefix is not None:
                om, oc = _checked_prefix(o.mem_prefix, o.mem_capacity, pp, n, f"options[{i}]: ")
                om.setflags(write=False)
                oc.setflags(write=False)
            opts.append(StageOption(ot, om, oc, tuple(_checked_bound(b, pp, n, f"options[{i}].memory[{j}]")
                                                      for j, b in enumerate(o.memory))))
        object.__setattr__(self, "options", tuple(opts))
        for arr in (self.time_prefix, self.transfer, self.mem_prefix, self.mem_capacity, self.sync_prefix,
                    self.stage_s, self.sync_s, self.sync_once):
            if arr is not None:
                arr.setflags(write=False)

    @property
    def pp(self) -> int:
        """Number of pipeline stages."""
        return int(self.time_prefix.shape[0])

    @property
    def num_layers(self) -> int:
        """Number of layers L."""
        return int(self.time_prefix.shape[1] - 1)

    @classmethod
    def uniform_stages(cls, layer_s: Sequence[float], pp: int, gas: int, transfer: np.ndarray | None = None,
                       layer_params: Sequence[float] | None = None, sync_s_per_param: Sequence[float] | None = None
                       ) -> StageCosts:
        """Costs where every stage runs a layer equally fast (AMP's setting).

        ``layer_s``: seconds per layer (L,). ``transfer``: (pp-1, L+1) as in the class, default zeros.
        ``layer_params`` with ``sync_s_per_param`` (pp,) adds a sync term ``params(stage) * sync_s_per_param[j]``.
        """
        t = np.asarray(layer_s, dtype=float)
        prefix = np.concatenate([[0.0], np.cumsum(t)])
        time_prefix = np.tile(prefix, (pp, 1))
        sync = None
        if layer_params is not None:
            pp_prefix = np.concatenate([[0.0], np.cumsum(np.asarray(layer_params, dtype=float))])
            rate = np.ones(pp) if sync_s_per_param is None else np.asarray(sync_s_per_param, dtype=float)
            sync = rate[:, None] * pp_prefix[None, :]
        return cls(time_prefix, transfer, gas, sync_prefix=sync)


def _bounds(mem_prefix: np.ndarray | None, mem_capacity: np.ndarray | None,
            memory: tuple[MemoryBound, ...]) -> tuple[MemoryBound, ...]:
    """The additive bound of ``mem_prefix``/``mem_capacity`` (when given) followed by ``memory``."""
    if mem_prefix is None or mem_capacity is None:
        return memory
    return (MemoryBound.of(mem_prefix, mem_capacity), *memory)


def _checked_prefix(prefix: np.ndarray, capacity: np.ndarray | None, pp: int, n: int,
                    what: str) -> tuple[np.ndarray, np.ndarray]:
    """Float copies of a memory prefix (pp, n) and its capacities (pp,); ValueError naming ``what`` otherwise."""
    mp = np.array(prefix, dtype=float)
    cap = np.array(capacity, dtype=float).reshape(-1)
    if mp.shape != (pp, n) or cap.shape != (pp,):
        raise ValueError(f"{what}mem_prefix must be {(pp, n)} and mem_capacity {(pp,)}, got {mp.shape}, {cap.shape}")
    if not np.all(np.isfinite(mp)) or np.any(np.isnan(cap)):
        raise ValueError(f"{what}mem_prefix must be finite and mem_capacity a number (inf allowed)")
    return mp, cap


def _checked_bound(bound: MemoryBound, pp: int, n: int, what: str) -> MemoryBound:
    """``bound`` checked for ``pp`` stages and ``n - 1`` layers: itself when its arrays are read-only floats already
    (the search's cached bounds, with what they cache), else a read-only float copy; ValueError naming ``what``."""
    got: dict[str, np.ndarray | None] = {}
    operands = len(bound.head) if np.ndim(bound.head) == 3 and len(bound.head) > 0 else 1
    for name, shape in (("head", (operands, pp, n)), ("tail", (operands, pp, n)), ("capacity", (pp,)),
                        ("peak", (pp, n - 1))):
        raw = getattr(bound, name)
        arr = None if raw is None else np.asarray(raw, dtype=float)
        if arr is not None and name == "capacity" and arr.ndim != 1:
            arr = arr.reshape(-1)
        if arr is None and name != "peak":
            raise ValueError(f"{what}: {name} is required")
        if arr is not None and arr.shape != shape:
            raise ValueError(f"{what}: {name} must have shape {shape}, got {arr.shape}")
        if arr is not None and (np.any(np.isnan(arr)) if name == "capacity" else not np.all(np.isfinite(arr))):
            raise ValueError(f"{what}: {name} must be " + ("a number (inf allowed)" if name == "capacity"
                                                           else "finite"))
        got[name] = arr
    if all(arr is None or (arr is getattr(bound, name) and not arr.flags.writeable) for name, arr in got.items()):
        return bound
    copies = [None if arr is None else np.array(arr) for arr in got.values()]
    for arr in copies:
        if arr is not None:
            arr.setflags(write=False)
    head, tail, capacity, peak = copies
    assert head is not None and tail is not None and capacity is not None
    return MemoryBound(head, tail, capacity, peak)


@dataclass(frozen=True)
class Assignment:
    """One partition with its costs. ``partition`` is DeepSpeed ``parts`` (pp+1 boundaries, 0 … L)."""

    partition: tuple[int, ...]
    eq5_s: float  # (gas-1)·max t + Σ t + Σ e, seconds
    full_s: float  # eq5_s + max sync (= eq5_s when there is no sync term), seconds
    stage_s: tuple[float, ...]  # t_j, seconds per micro-batch
    transfer_s: tuple[float, ...]  # e_j, seconds
    sync_s: tuple[float, ...]  # y_j, seconds (empty without a sync term)
    fits: bool  # every stage within its memory capacity
    options: tuple[int, ...] = ()  # per stage: the option it runs (0 = the base arrays; StageCosts.options)

    @property
    def bottleneck_s(self) -> float:
        """Largest stage time, seconds."""
        return max(self.stage_s)

    def objective(self, name: str) -> float:
        """The value of objective ``name`` ("full" or "eq5")."""
        return self.full_s if name == "full" else self.eq5_s


def check_partition(partition: Sequence[int], pp: int, num_layers: int) -> tuple[int, ...]:
    """Validate DeepSpeed-style boundaries (0 = p_0 < p_1 < … < p_pp = L). Raises ValueError."""
    p = tuple(int(x) for x in partition)
    if len(p) != pp + 1 or p[0] != 0 or p[-1] != num_layers or any(b <= a for a, b in itertools.pairwise(p)):
        raise ValueError(f"partition {list(p)} is not {pp + 1} strictly increasing boundaries from 0 to {num_layers}")
    return p


def stage_choice(costs: StageCosts, parts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For partitions ``parts`` (n, pp+1): stage seconds (n, pp) under each stage's option (``stage_s`` included),
    the option index (n, pp) and whether every stage fits (n,). A stage takes its fastest fitting option, the
    lowest index on ties; option 0 (and no fit) when none fits."""
    rows = np.arange(costs.pp)
    lo, hi = parts[:, :-1], parts[:, 1:]

    def seg(prefix: np.ndarray) -> np.ndarray:
        return prefix[rows, hi] - prefix[rows, lo]

    def meets(bounds: tuple[MemoryBound, ...]) -> np.ndarray:
        ok = np.ones(lo.shape, dtype=bool)
        for bound in bounds:
            ok &= bound.fits(rows, lo, hi)
        return ok

    base_t = seg(costs.time_prefix)
    best_t = np.where(meets(costs.memory_bounds), base_t, np.inf)
    choice = np.zeros(base_t.shape, dtype=np.int64)
    for i, o in enumerate(costs.options, start=1):
        t_o = np.where(meets(o.memory_bounds), seg(o.time_prefix), np.inf)
        better = t_o < best_t
        best_t = np.where(better, t_o, best_t)
        choice = np.where(better, i, choice)
    fits = np.isfinite(best_t)
    t = np.where(fits, best_t, base_t)
    if costs.stage_s is not None:
        t = t + costs.stage_s
    return t, choice, np.asarray(fits.all(axis=1))


def with_sync_constants(costs: StageCosts, y: np.ndarray) -> np.ndarray:
    """Stage syncs ``y`` (segment differences of ``sync_prefix``, stages on the last axis) plus ``sync_once`` where
    a stage has sync work and ``sync_s``."""
    if costs.sync_once is not None:
        y = y + np.where(y > 0, costs.sync_once, 0.0)
    if costs.sync_s is not None:
        y = y + costs.sync_s
    return y


def pipeline_s(costs: StageCosts, t: np.ndarray, e: np.ndarray) -> np.ndarray:
    """The eq5 objective (module docstring) of stage times ``t`` (n, pp) and transfers ``e`` (n, pp-1)."""
    held = t
    if costs.blocking and costs.pp > 1:
        held = t.copy()
        held[:, :-1] += e
        held[:, 1:] += e
    steady = (costs.gas - 1) * held.max(axis=1) if costs.gas > 1 else 0.0  # (0 · a forbidden cut's inf: none)
    return steady + t.sum(axis=1) + e.sum(axis=1)


def evaluate_partition(costs: StageCosts, partition: Sequence[int]) -> Assignment:
    """Cost one partition: the reference arithmetic every solver and test compares against."""
    p = np.asarray(check_partition(partition, costs.pp, costs.num_layers))
    rows = np.arange(costs.pp)
    t2, choice, fit = stage_choice(costs, p[None, :])
    t = t2[0]
    e = costs.transfer_s[rows[:-1], p[1:-1]] if costs.pp > 1 else np.zeros(0)
    eq5 = float(pipeline_s(costs, t[None, :], e[None, :])[0])
    sync: tuple[float, ...] = ()
    full = eq5
    if costs.sync_prefix is not None:
        y = costs.sync_prefix[rows, p[1:]] - costs.sync_prefix[rows, p[:-1]]
        y = with_sync_constants(costs, y)
        sync = tuple(float(v) for v in y)
        full = eq5 + float(y.max())
    return Assignment(tuple(int(x) for x in p), eq5, full, tuple(float(v) for v in t), tuple(float(v) for v in e),
                      sync, bool(fit[0]), tuple(int(c) for c in choice[0]))
