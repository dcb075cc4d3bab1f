"""How long ``benchmarks/gpu_check.sh`` takes on a GPU, step by step, at the pace measured on one H200.

``python benchmarks/support/gpu_check_budget.py STEP...`` prints each step's estimate and its basis to stderr and the
total (whole seconds) to stdout; the script prints it before it starts and stops when it exceeds its budget. The
arithmetic is shown in docs/gpu_check.md. Steps:

* ``setup``: the guard, the environment, the profile processes' start;
* ``profile:KERNEL[:SEQ]``: one ``ampe profile`` call (eager without energy, flash with NVML energy), recompute none
  and full, mbs 1, 2, 4, warmup 2, repeats 5, ``--blocks-measured`` of the model's 16 blocks measured; another
  sequence length is charged as much as the record's (shorter ones are faster: a bound);
* ``merge``: ``ampe profile --merge`` (one Python start: estimated, not measured on a GPU);
* ``plan:NAME``: ``ampe search`` and ``ampe report`` of one plan;
* ``trial:NAME:K[:DIR]``: the plan's first K trials, less those already finished in DIR's ``results.jsonl``
  (``trial:flash_none_es_on:1``: the record's flash/none rank-1 trial, which it repeats with expandable segments);
* ``export``: export, the user script, the summary (and the record's second run's own setup).

Every figure comes from the record (``tests/data/h200/gpu_check``: its README's step times, the profile's per-layer
times, the trial records' wall times and start times) except two, stated as such: a block's build time, measured on
the development VM's CPU, and the merge's Python start.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ampe.formats.trial import FINISHED
from ampe.io import csv_records, read_text

RECORD = ROOT / "tests" / "data" / "h200" / "gpu_check"
# The record's README: the first run profiled seq 4096 in 234 s, of which `ampe profile` reported eager 85 s and
# flash 124 s (its own timer); the second run did everything after the profile in 288 s.
PROFILE_RUN_S = 234.0
PROFILE_CALL_S = {"eager": 85.0, "flash": 124.0}
REST_RUN_S = 288.0
PAIRS_PER_ROW = 1 + 2 + 5  # the profiler's memory pass, warmup 2, repeats 5 (the record's settings)
BLOCKS = 16
# Estimated: building one Llama-3.2-1B block and casting it to bf16 took 0.34-0.58 s on the development VM's CPU
# (build_runtime_layer); the low end is taken (a smaller saving, a longer estimate).
BLOCK_BUILD_S = 0.34
MERGE_S = 2.0  # estimated: one Python start importing ampe's formats, no torch


@dataclass(frozen=True)
class Step:
    """One step's estimate (s), what it rests on, and its bound where the estimate assumes more than the record."""

    name: str
    seconds: float
    basis: str
    bound_s: float | None = None


@dataclass(frozen=True)
class Pace:
    """What the record measured, per unit of work (seconds)."""

    block_pairs_s: dict[tuple[str, str], float]  # (kernel, recompute) → the timed pairs of one block over mbs 1,2,4
    mbs_count: int
    energy_window_s: float  # one layer's NVML window, with its syncs
    trial_s: dict[tuple[str, int], float]  # (plan, rank) → wall time of the trial
    plan_s: float  # search + report between two plans' trials
    rest_s: float  # export, user script, summary, the second run's setup


def pace(record: Path = RECORD) -> Pace:
    """The measured pace of ``record`` (a ``gpu_check`` folder with the README's step times above)."""
    src = str(record / "profile_s4096.csv")
    pairs: dict[tuple[str, str], float] = {}
    timed: dict[str, float] = {}
    windows, mbs = 0, set()
    for _, c in csv_records(src, read_text(src), ("layer_kind", "attention", "recompute", "forward_s")):
        mbs.add(c["mbs"])
        pair = PAIRS_PER_ROW * (float(c["forward_s"]) + float(c["backward_s"]))
        if c["recompute"] == "full" and c["layer_kind"] != "transformer":
            continue  # repeats its none row: not measured again
        timed[c["attention"]] = timed.get(c["attention"], 0.0) + pair
        windows += c.get("forward_j", "") != ""
        if c["layer_kind"] == "transformer":
            key = (c["attention"], c["recompute"])
            pairs[key] = pairs.get(key, 0.0) + pair / BLOCKS
    # the flash call's extra time over eager's, less the difference of their timed pairs, is its energy windows'
    window = (PROFILE_CALL_S["flash"] - PROFILE_CALL_S["eager"] - (timed["flash"] - timed["eager"])) / windows
    trials: dict[tuple[str, int], float] = {}
    spans: list[tuple[datetime, datetime, str]] = []
    for path in sorted(record.glob("trials_*.jsonl")):
        plan = path.stem.removeprefix("trials_")
        for line in path.read_text().splitlines():
            r = json.loads(line)
            trials[(plan, r["plan_rank"])] = r["wall_s"]
            start = datetime.fromisoformat(r["started_at"])
            spans.append((start, start.fromtimestamp(start.timestamp() + r["wall_s"], start.tzinfo), plan))
    spans.sort()
    gaps = [(b[0] - a[1]).total_seconds() for a, b in itertools.pairwise(spans) if a[2] != b[2]]
    plan_s = sum(gaps) / len(gaps)
    plans = len({s[2] for s in spans})
    return Pace(pairs, len(mbs), window, trials, plan_s, REST_RUN_S - sum(trials.values()) - plans * plan_s)


def profile_step(p: Pace, kernel: str, measured_blocks: int, seq: str | None) -> Step:
    """One ``ampe profile`` call: the record's, less the blocks it no longer measures (their timed pairs, energy
    windows and builds)."""
    skipped = BLOCKS - measured_blocks
    pairs = skipped * sum(v for (k, _), v in p.block_pairs_s.items() if k == kernel)
    windows = skipped * 2 * p.mbs_count * p.energy_window_s if kernel == "flash" else 0.0
    builds = skipped * p.mbs_count * BLOCK_BUILD_S
    bound = PROFILE_CALL_S[kernel] - pairs - windows
    energy = " and energy windows" if windows else ""
    return Step(f"profile {kernel}" + (f" (seq {seq})" if seq else ""), bound - builds,
                f"measured {PROFILE_CALL_S[kernel]:.0f} s less {skipped} blocks' timed pairs{energy} "
                f"({pairs + windows:.0f} s) and builds ({builds:.0f} s, estimated)", bound)


def estimate(steps: Sequence[str], measured_blocks: int, p: Pace) -> list[Step]:
    """Each step's :class:`Step` (the step language of the module docstring)."""
    out = []
    for text in steps:
        kind, *args = text.split(":", 3)  # a trial's folder may hold colons
        if kind == "setup":
            out.append(Step("setup", PROFILE_RUN_S - sum(PROFILE_CALL_S.values()),
                            "measured: the first run's time outside its two profile calls"))
        elif kind == "profile":
            out.append(profile_step(p, args[0], measured_blocks, args[1] if len(args) > 1 else None))
        elif kind == "merge":
            out.append(Step("merge profiles", MERGE_S, "estimated: one Python start"))
        elif kind == "plan":
            out.append(Step(f"search + report {args[0]}", p.plan_s, "measured: mean gap between plans' trials"))
        elif kind == "trial":
            out.append(trial_step(p, args[0], int(args[1]), args[2] if len(args) > 2 else None))
        elif kind == "export":
            out.append(Step("export, user script, summary", p.rest_s,
                            "measured: the second run less its trials and searches"))
        else:
            raise SystemExit(f"gpu_check_budget: unknown step {text!r}")
    return out


def trial_step(p: Pace, plan: str, k: int, folder: str | None) -> Step:
    """The first ``k`` trials of ``plan`` not yet finished in ``folder``."""
    done = _finished(Path(folder)) if folder else 0
    like = "flash_none" if plan.startswith("flash_none") else plan
    walls = [p.trial_s.get((like, rank), max(p.trial_s.values())) for rank in range(done + 1, k + 1)]
    what = "measured" if like == plan else f"estimated as {like}'s, measured"
    kept = f", {done} kept" if done else ""
    return Step(f"trials {plan} ({k - done} of {k}{kept})", sum(walls), what)


def _finished(folder: Path) -> int:
    """Trials whose latest record in ``folder/results.jsonl`` a resume does not run again."""
    path = folder / "results.jsonl"
    if not path.exists():
        return 0
    latest: dict[str, str] = {}
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:  # a cut last line (the runner's append was interrupted)
            continue
        if r.get("status") != "skipped":
            latest[r.get("key", "")] = r.get("status", "")
    return sum(s in FINISHED for s in latest.values())


def main(argv: list[str] | None = None) -> int:
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("steps", nargs="*")
    a.add_argument("--blocks-measured", type=int, default=1, help="blocks each profile call measures (1 of 16)")
    a.add_argument("--budget", type=float, default=420.0, help="seconds the check may take (7 min)")
    a.add_argument("--record", type=Path, default=RECORD)
    args = a.parse_args(argv)
    steps = estimate(args.steps, args.blocks_measured, pace(args.record))
    total = sum(s.seconds for s in steps)
    bound = sum(s.bound_s if s.bound_s is not None else s.seconds for s in steps)
    err = sys.stderr
    where = args.record.relative_to(ROOT) if args.record.is_relative_to(ROOT) else args.record
    print(f"GPU time estimate, at the pace measured on one H200 ({where}):", file=err)
    for s in steps:
        print(f"  {s.name:<44} {s.seconds:6.0f} s  {s.basis}", file=err)
    print(f"  {'total':<44} {total:6.0f} s  of a {args.budget:.0f} s budget"
          + (f" (at most {bound:.0f} s if a block's build took no time)" if bound > total else ""), file=err)
    print(round(total))
    return 0


if __name__ == "__main__":
    sys.exit(main())
