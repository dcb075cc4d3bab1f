"""A parallel strategy: degrees, micro-batching, device placement, layer partition and pipeline schedule.

Rank layout (Megatron / DeepSpeed ``PipeModelDataParallelTopology``): tensor-parallel index innermost, then data
parallel, then pipeline::

    rank(stage j, replica r, shard k) = j·dp·tp + r·tp + k

``placement[rank]`` is the device id that rank runs on (default: the identity, i.e. Megatron order).
``partition`` is DeepSpeed ``parts``: stage j owns layers ``partition[j] .. partition[j+1]-1``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from ampe.errors import InputError

SCHEDULES = ("1f1b", "gpipe", "interleaved")
ATTENTIONS = ("eager", "flash")  # the attention kernel a strategy runs (ampe.costmodel.model.ATTENTIONS)
DTYPES = ("fp32", "bf16", "fp16")  # training precisions (ampe.costmodel.model.BYTES_PER_ELEM)
RECOMPUTE = ("none", "selective", "full")  # activation recomputation (ampe.costmodel.memory)
ZERO_STAGES = (0, 1)  # ZeRO stage over the data-parallel group
MAX_GLOBAL_BATCH = 1 << 22  # samples per iteration: far above any real training run
MAX_DEGREE = 1 << 16  # pp, dp, tp, mbs, virtual stages


@dataclass(frozen=True)
class Strategy:
    """One point of the search space. Use :func:`complete` to fill defaults before costing it."""

    pp: int
    dp: int
    tp: int
    mbs: int
    gbs: int
    partition: tuple[int, ...] | None = None
    placement: tuple[int, ...] | None = None
    schedule: str = "1f1b"
    virtual_stages: int = 1  # model chunks per device for the interleaved schedule
    recompute: str = "none"  # activation recomputation: none, selective (attention scores) or full (every block)
    zero: int = 0  # ZeRO stage: 0 (none) or 1 (optimizer states sharded over the dp group)
    # per pipeline (device) stage when the stages differ (``recompute`` is then the costliest of them); None: every
    # stage runs ``recompute``. Build it with :func:`with_stage_recompute`.
    stage_recompute: tuple[str, ...] | None = None
    # How the strategy runs beyond its layout, when a record names it: the attention kernel (eager, flash) and the
    # training precision (fp32, bf16, fp16). None: the model's own (what the planner was given). The cost model
    # costs a strategy that names others on that variant of the model (CostModel.for_strategy).
    attention: str | None = None
    dtype: str | None = None
    # Whether fp32 matrix products may run as TF32 (torch.backends.cuda.matmul.allow_tf32 and cudnn's, which the
    # runtime sets as the plan says). None: the model's own (PyTorch's defaults at run time).
    tf32: bool | None = None
    # PyTorch's caching allocator with ``expandable_segments`` (PYTORCH_CUDA_ALLOC_CONF, set by the trial runner and
    # the export for every rank): True/False as the plan sets it; None: not set (PyTorch's default, off). It sets
    # the allocator's fragmentation in the footprint (ampe.costmodel.memory).
    expandable_segments: bool | None = None
    # Each data-parallel replica's share of the batch, in micro-batches (replica r runs replica_gas[r] micro-batches
    # of mbs samples; gbs = mbs·Σ replica_gas). None: equal shares, gbs/(dp·mbs) each. Build it with
    # :func:`with_shares`, which keeps equal shares as None so equal-share plans read as before.
    replica_gas: tuple[int, ...] | None = None

    def recompute_at(self, stage: int) -> str:
        """Activation recomputation of pipeline (device) stage ``stage``."""
        return self.stage_recompute[stage] if self.stage_recompute is not None else self.recompute

    @property
    def recompute_label(self) -> str:
        """``recompute`` for one option, else the per-stage runs, e.g. ``full×2,selective,none×5``."""
        return recompute_label(self.stage_recompute) if self.stage_recompute is not None else self.recompute

    @property
    def gas(self) -> int:
        """The most micro-batches one pipeline runs per iteration (gradient accumulation steps): every pipeline's
        under equal shares, the largest share otherwise (see :attr:`shares`)."""
        return max(self.replica_gas) if self.replica_gas is not None else self.gbs // (self.dp * self.mbs)

    @property
    def shares(self) -> tuple[int, ...]:
        """Micro-batches per iteration of each data-parallel replica (all equal unless ``replica_gas`` is set)."""
        return self.replica_gas if self.replica_gas is not None else (self.gbs // (self.dp * self.mbs),) * self.dp

    @property
    def uneven(self) -> bool:
        """Whether the replicas' shares of the batch differ."""
        return self.replica_gas is not None

    @property
    def world_size(self) -> int:
        """Number of ranks, pp·dp·tp."""
        return self.pp * self.dp * self.tp

    def rank(self, stage: int, replica: int, shard: int) -> int:
        """Global rank of (pipeline stage, data-parallel replica, tensor-parallel shard)."""
        return stage * self.dp * self.tp + replica * self.tp + shard

    def device(self, stage: int, replica: int, shard: int) -> int:
        """Device id of (stage, replica, shard); requires a placement (see :func:`complete`)."""
        assert self.placement is not None
        return self.placement[self.rank(stage, replica, shard)]

    def stage_devices(self, stage: int, replica: int) -> tuple[int, ...]:
        """Device ids of one stage of one replica (its tensor-parallel group)."""
        return tuple(self.device(stage, replica, k) for k in range(self.tp))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form accepted back by :func:`strategy_from_dict`."""
        out: dict[str, Any] = {"pp": self.pp, "dp": self.dp, "tp": self.tp, "mbs": self.mbs, "gbs": self.gbs,
                               "gas": self.gas}
        if self.partition is not None:
            out["partition"] = list(self.partition)
        if self.placement is not None:
            out["placement"] = list(self.placement)
        out["schedule"] = self.schedule
        if self.virtual_stages != 1:
            out["virtual_stages"] = self.virtual_stages
        if self.recompute != "none":
            out["recompute"] = self.recompute
        if self.stage_recompute is not None:
            out["stage_recompute"] = list(self.stage_recompute)
        if self.zero:
            out["zero"] = self.zero
        if self.attention is not None:
            out["attention"] = self.attention
        if self.dtype is not None:
            out["dtype"] = self.dtype
        if self.tf32 is not None:
            out["tf32"] = self.tf32
        if self.expandable_segments is not None:
            out["expandable_segments"] = self.expandable_segments
        if self.replica_gas is not None:
            out["replica_gas"] = list(self.replica_gas)
        return out


def recompute_label(stages: Iterable[str]) -> str:
    """Per-stage recomputation as runs of equal stages, e.g. ``full×2,selective,none×5``."""
    runs = [(r, len(list(g))) for r, g in itertools.groupby(stages)]
    return ",".join(f"{r}×{n}" if n > 1 else r for r, n in runs)


def with_stage_recompute(s: Strategy, recs: Iterable[str]) -> Strategy:
    """``s`` with recomputation per pipeline stage ``recs`` (one per device stage): one value when they agree, else
    ``stage_recompute`` with ``recompute`` the costliest (none < selective < full)."""
    stages = tuple(recs)
    if len(set(stages)) <= 1:
        return replace(s, recompute=stages[0] if stages else s.recompute, stage_recompute=None)
    return replace(s, recompute=max(stages, key=RECOMPUTE.index), stage_recompute=stages)


def with_shares(s: Strategy, shares: Iterable[int]) -> Strategy:
    """``s`` with replica r running ``shares[r]`` micro-batches (``gbs`` follows); equal shares are stored as None."""
    per = tuple(shares)
    if len(per) != s.dp or any(g < 1 for g in per):
        raise ValueError(f"needs a positive share per replica ({s.dp}), got {per}")
    return replace(s, gbs=s.mbs * sum(per), replica_gas=None if len(set(per)) == 1 else per)


def strategy_identity(s: Strategy) -> tuple:
    """What makes two strategies one plan entry, the replicas' shares of the batch apart (a variant of one layout
    differs only in them; callers that keep such variants apart add ``s.shares`` or ``s.replica_gas``): degrees,
    micro-batch and global batch (samples), partition, placement, schedule, recomputation and ZeRO stage."""
    return (s.pp, s.dp, s.tp, s.mbs, s.gbs, s.partition, s.placement, s.schedule, s.virtual_stages, s.recompute,
            s.stage_recompute, s.zero)


def shares_label(s: Strategy) -> str:
    """Micro-batches per replica for a table: the count under equal shares (``4``), else the shares
    (``5:3``), runs of equal shares counted beyond four replicas (``5×2:3×6``)."""
    if s.replica_gas is None:
        return str(s.gas)
    if len(s.replica_gas) <= 4:
        return ":".join(map(str, s.replica_gas))
    return ":".join(f"{g}×{len(list(run))}" for g, run in itertools.groupby(s.replica_gas))


def uniform_partition(num_layers: int, pp: int) -> tuple[int, ...]:
    """Layer boundaries giving every stage ⌊L/pp⌋ layers, the remainder to the earliest stages."""
    base, extra = divmod(num_layers, pp)
    bounds = [0]
    for j in range(pp):
        bounds.append(bounds[-1] + base + (1 if j < extra else 0))
    return tuple(bounds)


def complete(s: Strategy, num_layers: int) -> Strategy:
    """Fill the default partition (uniform layers) and placement (Megatron order)."""
    part = s.partition if s.partition is not None else uniform_partition(num_layers, s.pp * s.virtual_stages)
    place = s.placement if s.placement is not None else tuple(range(s.world_size))
    return replace(s, partition=tuple(part), placement=tuple(place))


def validate(s: Strategy, num_devices: int, num_layers: int, source: str = "strategy") -> Strategy:
    """Check a strategy against a cluster size and layer count; return it completed. Raises InputError."""
    for key in ("pp", "dp", "tp", "mbs", "gbs", "virtual_stages"):
        v = getattr(s, key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise InputError(source, key, f"must be a positive integer, got {v!r}")
    if s.schedule not in SCHEDULES:
        raise InputError(source, "schedule", f"must be one of {', '.join(SCHEDULES)}, got {s.schedule!r}")
    if s.recompute not in RECOMPUTE:
        raise InputError(source, "recompute", f"must be one of {', '.join(RECOMPUTE)}, got {s.recompute!r}")
    if s.stage_recompute is not None:
        if len(s.stage_recompute) != s.pp or any(r not in RECOMPUTE for r in s.stage_recompute):
            raise InputError(source, "stage_recompute", f"needs one of {', '.join(RECOMPUTE)} per pipeline stage "
                             f"({s.pp}), got {list(s.stage_recompute)}")
        if s.virtual_stages != 1:
            raise InputError(source, "stage_recompute", "per-stage recomputation needs one model chunk per device "
                             "(not the interleaved schedule)")
    if s.zero not in ZERO_STAGES:
        raise InputError(source, "zero", f"must be 0 or 1 (ZeRO stage), got {s.zero!r}")
    if s.attention not in (None, *ATTENTIONS):
        raise InputError(source, "attention", f"must be one of {', '.join(ATTENTIONS)}, got {s.attention!r}")
    if s.dtype not in (None, *DTYPES):
        raise InputError(source, "dtype", f"must be one of {', '.join(DTYPES)}, got {s.dtype!r}")
    if s.tf32 not in (None, True, False):
        raise InputError(source, "tf32", f"must be true or false, got {s.tf32!r}")
    if s.expandable_segments not in (None, True, False):
        raise InputError(source, "expandable_segments", f"must be true, false or null, got "
                         f"{s.expandable_segments!r}")
    if s.schedule != "interleaved" and s.virtual_stages != 1:
        raise InputError(source, "virtual_stages", "only the interleaved schedule has virtual stages")
    if s.world_size != num_devices and (s.placement is None or s.world_size > num_devices):
        raise InputError(source, "pp·dp·tp", f"{s.pp}·{s.dp}·{s.tp} = {s.world_size} but the cluster has "
                         f"{num_devices} devices" + ("" if s.world_size > num_devices else
                                                     " (give a placement to use only some of them)"))
    if s.replica_gas is not None:
        _check_shares(s, source)
    elif s.gbs % s.dp:
        raise InputError(source, "gbs", f"global batch {s.gbs} is not divisible by dp={s.dp}")
    elif (s.gbs // s.dp) % s.mbs:
        raise InputError(source, "mbs", f"mbs={s.mbs} does not divide gbs/dp = {s.gbs // s.dp}")
    chunks = s.pp * s.virtual_stages
    if chunks > num_layers:
        raise InputError(source, "pp", f"{chunks} pipeline stages for {num_layers} layers")
    if s.partition is not None:
        p = list(s.partition)
        if len(p) != chunks + 1:
            raise InputError(source, "partition", f"needs {chunks + 1} boundaries for {chunks} stages, got {len(p)}")
        if p[0] != 0 or p[-1] != num_layers:
            raise InputError(source, "partition", f"must start at 0 and end at {num_layers} (the number of layers) "
                             f"so every layer is covered exactly once, got {p}")
        if any(b <= a for a, b in itertools.pairwise(p)):
            raise InputError(source, "partition", f"boundaries must strictly increase (no empty stage), got {p}")
    if s.placement is not None:
        pl = list(s.placement)
        if len(pl) != s.world_size:
            raise InputError(source, "placement", f"needs one device id per rank ({s.world_size}), got {len(pl)}")
        if len(set(pl)) != len(pl) or not all(0 <= d < num_devices for d in pl):
            raise InputError(source, "placement", f"must name distinct device ids in 0..{num_devices - 1} (all of "
                             "them, or a subset: the devices left out stay idle)")
    return complete(s, num_layers)


def _check_shares(s: Strategy, source: str) -> None:
    per = s.replica_gas
    assert per is not None
    if len(per) != s.dp or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 1 for g in per):
        raise InputError(source, "replica_gas", f"needs a positive number of micro-batches per replica ({s.dp}), "
                         f"got {_short(list(per))}")
    if s.mbs * sum(per) != s.gbs:
        raise InputError(source, "replica_gas", f"mbs·Σ replica_gas = {s.mbs * sum(per)} but gbs = {s.gbs}")
    if s.schedule == "interleaved" and s.virtual_stages > 1 and any(g % s.pp for g in per):
        raise InputError(source, "replica_gas", f"the interleaved schedule runs a multiple of pp={s.pp} micro-batches "
                         f"per replica, got {_short(list(per))}")


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else f"{text[:30]}… ({len(text)} characters)"


def _int_list(v: Any, source: str, key: str) -> tuple[int, ...]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise InputError(source, key, "must be a list of integers")
    return tuple(v)


STRATEGY_KEYS = ("pp", "dp", "tp", "mbs", "gbs", "global_batch", "gas", "partition", "placement", "schedule",
                 "virtual_stages", "recompute", "stage_recompute", "zero", "attention", "dtype", "tf32",
                 "expandable_segments", "replica_gas")


def strategy_from_dict(d: Any, source: str = "strategy", default_gbs: int | None = None) -> Strategy:
    """Parse ``{pp, dp, tp, mbs, gbs?, gas?, partition?, placement?, schedule?, recompute?, stage_recompute?,
    zero?, attention?, dtype?, tf32?, expandable_segments?, replica_gas?}`` (absent attention/dtype/tf32: the
    model's own; absent expandable_segments: not set; absent replica_gas: equal shares); extra keys are ignored so
    plan entries (with ``rank``, ``predicted``, ``deepspeed``...) are valid input, except a near miss of a
    strategy key (``partiton``), which is refused as a typo."""
    if not isinstance(d, dict):
        raise InputError(source, "(root)", "a strategy must be a JSON object")
    _refuse_near_misses(d, source)
    vals: dict[str, Any] = {}
    for key in ("pp", "dp", "tp", "mbs"):
        if key not in d:
            raise InputError(source, key, "missing")
        vals[key] = d[key]
    for key, v in vals.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1 or v > MAX_DEGREE:
            raise InputError(source, key, f"must be an integer in 1..{MAX_DEGREE}, got {_short(v)}")
    gbs, shares = _global_batch(d, vals, source, default_gbs)
    part = _int_list(d["partition"], source, "partition") if d.get("partition") is not None else None
    place = _int_list(d["placement"], source, "placement") if d.get("placement") is not None else None
    sched = d.get("schedule", "1f1b")
    if not isinstance(sched, str):
        raise InputError(source, "schedule", "must be a string")
    vs = d.get("virtual_stages", 1)
    if not isinstance(vs, int) or isinstance(vs, bool) or not 1 <= vs <= MAX_DEGREE:
        raise InputError(source, "virtual_stages", f"must be an integer in 1..{MAX_DEGREE}, got {_short(vs)}")
    if gbs > MAX_GLOBAL_BATCH:
        raise InputError(source, "gas", f"gives a global batch above {MAX_GLOBAL_BATCH}")
    rec = d.get("recompute", "none")
    if rec not in RECOMPUTE:
        raise InputError(source, "recompute", f"must be one of {', '.join(RECOMPUTE)}, got {_short(rec)}")
    zero = d.get("zero", 0)
    if zero not in ZERO_STAGES or isinstance(zero, bool):
        raise InputError(source, "zero", f"must be 0 or 1 (ZeRO stage), got {_short(zero)}")
    out = Strategy(pp=vals["pp"], dp=vals["dp"], tp=vals["tp"], mbs=vals["mbs"], gbs=gbs, partition=part,
                   placement=place, schedule=sched, virtual_stages=vs, recompute=rec, zero=zero,
                   **_numerics(d, source),
                   replica_gas=shares if shares is not None and len(set(shares)) > 1 else None)
    per = d.get("stage_recompute")
    if per is not None:
        if (not isinstance(per, list) or len(per) != vals["pp"]
                or not all(isinstance(r, str) and r in RECOMPUTE for r in per)):
            raise InputError(source, "stage_recompute", f"must list one of {', '.join(RECOMPUTE)} per pipeline "
                             f"stage ({vals['pp']}), got {_short(per)}")
        out = with_stage_recompute(out, per)
        if "recompute" in d and rec != out.recompute:
            raise InputError(source, "recompute", f"{rec!r} disagrees with stage_recompute (costliest: "
                             f"{out.recompute!r})")
    return out


def _refuse_near_misses(d: dict[Any, Any], source: str) -> None:
    """Extra keys are allowed (plan entries), but a near miss of a strategy key is a typo that would silently fall
    back to a default (a misspelled partition gets the DP's partition): refused."""
    for key in d:
        if key not in STRATEGY_KEYS and isinstance(key, str):
            import difflib  # lazily: only documents with extra keys (plan entries) pay its import

            close = difflib.get_close_matches(key, STRATEGY_KEYS, n=1, cutoff=0.8)
            if close:
                raise InputError(source, key, f"unknown key (did you mean {close[0]!r}?)")


def _global_batch(d: dict[str, Any], vals: dict[str, Any], source: str,
                  default_gbs: int | None) -> tuple[int, tuple[int, ...] | None]:
    """The strategy's global batch (samples) from ``gbs``, ``gas`` or ``replica_gas`` (``default_gbs`` when none is
    given), and the replicas' shares when given; refused where they disagree."""
    gbs, gas = d.get("gbs", d.get("global_batch")), d.get("gas")
    for key, v in (("gbs", gbs), ("gas", gas)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1 or v > MAX_GLOBAL_BATCH):
            raise InputError(source, key, f"must be an integer in 1..{MAX_GLOBAL_BATCH}, got {_short(v)}")
    shares = _shares_from(d, vals, source)
    if shares is not None:
        gbs = _shares_gbs(shares, gbs, gas, vals["mbs"], source)
    elif gbs is None and gas is not None:
        gbs = gas * vals["dp"] * vals["mbs"]
    elif gbs is not None and gas is not None and gbs != gas * vals["dp"] * vals["mbs"]:
        raise InputError(source, "gas", f"gas={gas} disagrees with gbs={gbs}, dp={vals['dp']}, mbs={vals['mbs']}")
    if gbs is None:
        if default_gbs is None:
            raise InputError(source, "gbs", "missing (give gbs or gas, or --global-batch)")
        gbs = default_gbs
    return gbs, shares


def _numerics(d: dict[str, Any], source: str) -> dict[str, Any]:
    """The strategy's ``attention``, ``dtype``, ``tf32`` and ``expandable_segments`` (None where absent: the
    model's own, or not set), checked."""
    attention, dtype = d.get("attention"), d.get("dtype")
    if attention is not None and attention not in ATTENTIONS:
        raise InputError(source, "attention", f"must be one of {', '.join(ATTENTIONS)}, got {_short(attention)}")
    if dtype is not None and dtype not in DTYPES:
        raise InputError(source, "dtype", f"must be one of {', '.join(DTYPES)}, got {_short(dtype)}")
    tf32 = d.get("tf32")
    if tf32 is not None and not isinstance(tf32, bool):
        raise InputError(source, "tf32", f"must be true or false, got {_short(tf32)}")
    expandable = d.get("expandable_segments")
    if expandable is not None and not isinstance(expandable, bool):
        raise InputError(source, "expandable_segments", f"must be true, false or null, got {_short(expandable)}")
    return {"attention": attention, "dtype": dtype, "tf32": tf32, "expandable_segments": expandable}


def _shares_from(d: dict[str, Any], vals: dict[str, Any], source: str) -> tuple[int, ...] | None:
    per = d.get("replica_gas")
    if per is None:
        return None
    if (not isinstance(per, list) or len(per) != vals["dp"]
            or not all(isinstance(g, int) and not isinstance(g, bool) and 1 <= g <= MAX_GLOBAL_BATCH for g in per)):
        raise InputError(source, "replica_gas", f"must list a number of micro-batches in 1..{MAX_GLOBAL_BATCH} per "
                         f"data-parallel replica ({vals['dp']}), got {_short(per)}")
    return tuple(per)


def _shares_gbs(shares: tuple[int, ...], gbs: Any, gas: Any, mbs: int, source: str) -> int:
    """The global batch uneven shares make, checked against ``gbs`` and ``gas`` (the largest share) where given."""
    total = mbs * sum(shares)
    if gbs is not None and gbs != total:
        raise InputError(source, "replica_gas", f"mbs·Σ replica_gas = {total} disagrees with gbs={gbs}")
    if gas is not None and gas != max(shares):
        raise InputError(source, "gas", f"gas={gas} is not the largest share of replica_gas ({max(shares)})")
    return total


def strategies_from_json(obj: Any, source: str, default_gbs: int | None = None) -> list[Strategy]:
    """One strategy, a list of them, or an ``ampe.plan/1`` file (its ``strategies``)."""
    if isinstance(obj, dict) and "strategies" in obj:
        obj = obj["strategies"]
        if not isinstance(obj, list):
            raise InputError(source, "strategies", "must be a list")
        label = "strategies"
    else:
        label = ""
    items: Iterable[Any] = obj if isinstance(obj, list) else [obj]
    out = []
    for i, d in enumerate(items):
        where = f"{label}[{i}]" if isinstance(obj, list) else ""
        try:
            out.append(strategy_from_dict(d, source, default_gbs))
        except InputError as e:
            raise InputError(source, f"{where}.{e.field}" if where else e.field, e.message) from None
    if not out:
        raise InputError(source, "(root)", "no strategies")
    return out
