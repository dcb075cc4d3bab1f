"""Helpers shared by subcommands: loading the three inputs, positive-int flags, table printing."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ampe.errors import InputError
from ampe.plausible import POWER_W

if TYPE_CHECKING:  # the cost model's loaders import pydantic and scipy: only the commands that load inputs pay
    from ampe.costmodel.cluster import Cluster
    from ampe.costmodel.estimate import Estimate
    from ampe.costmodel.model import Model
    from ampe.costmodel.profile import Profile

GiB = float(1 << 30)


MIN_UNIT_TIME_S = 1e-6  # frontier time quantum: below a microsecond the frontier has millions of steps


def positive_int(text: str) -> int:
    """argparse type: an integer ≥ 1."""
    return _int_at_least(text, 1)


def global_batch(text: str) -> int:
    """argparse type: a global batch, 1..MAX_GLOBAL_BATCH samples."""
    from ampe.costmodel.strategy import MAX_GLOBAL_BATCH  # only the commands taking a batch pay for the import

    v = _int_at_least(text, 1)
    if v > MAX_GLOBAL_BATCH:
        raise argparse.ArgumentTypeError(f"at most {MAX_GLOBAL_BATCH} samples, got {text[:20]}")
    return v


def unit_time(text: str) -> float:
    """argparse type: a frontier time quantum, ≥ MIN_UNIT_TIME_S seconds."""
    v = positive_float(text)
    if v < MIN_UNIT_TIME_S:
        raise argparse.ArgumentTypeError(f"must be ≥ {MIN_UNIT_TIME_S:g} s (a finer quantum only multiplies the work), "
                                         f"got {text}")
    return v


def non_negative_int(text: str) -> int:
    """argparse type: an integer ≥ 0."""
    return _int_at_least(text, 0)


def _int_at_least(text: str, low: int) -> int:
    if len(text) > 20:
        raise argparse.ArgumentTypeError(f"not a sensible integer: {text[:20]}...")
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"must be ≥ {low}, got {v}")
    return v


MAX_REMOTE_JOBS = 4096  # workers of a dask or ray cluster ampe asks for; far beyond any search's candidate groups


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system tells it)."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_jobs(jobs: int, remote: bool) -> None:
    """Refuse ``--jobs`` beyond what can run at once: local worker processes above the usable cores (each is a
    process; more only share the cores and multiply the memory), remote ones above MAX_REMOTE_JOBS."""
    most = MAX_REMOTE_JOBS if remote else usable_cores()
    if jobs > most:
        where = "workers ampe asks a remote scheduler for" if remote else "the cores this process may use"
        raise InputError("--jobs", "", f"at most {most} ({where}), got {jobs}")


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return v


MAX_SLOWDOWN_SHARE = 10.0  # --max-slowdown: at most 1000 %; no plan is worth 11× the fastest iteration
MAX_MARGIN_SHARE = 1.0  # --slack-margin: at most 100 % (planning as if slowed computations took twice as long)


def share(text: str, flag: str, most: float) -> float:
    """A share written ``5%`` or ``0.05`` → 0.05, from 0 to ``most``. A bare number above 1 is refused with the
    hint to write a percent sign: ``--max-slowdown 5`` would read as 500 % (a user's 15-minute energy planning)."""
    t = text.strip()
    percent = t.endswith("%")
    try:
        v = float(t[:-1].strip() if percent else t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a share: {text[:20]!r} (write 5% or 0.05)") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"must be a finite share ≥ 0 (5% or 0.05), got {text[:20]}")
    if percent:
        v /= 100.0
    elif v > 1 and v / 100 <= most:
        raise argparse.ArgumentTypeError(f"{text[:20]} reads as {v * 100:g} %; write {t[:18]}% (or {v / 100:g})")
    if v > most:
        raise argparse.ArgumentTypeError(f"at most {most * 100:g}% ({flag}), got {text[:20]}")
    return v


def slowdown_share(text: str) -> float:
    """argparse type of ``--max-slowdown``: :func:`share`, 0..1000 %."""
    return share(text, "--max-slowdown", MAX_SLOWDOWN_SHARE)


def margin_share(text: str) -> float:
    """argparse type of ``--slack-margin``: :func:`share`, 0..100 %."""
    return share(text, "--slack-margin", MAX_MARGIN_SHARE)


MAX_WATTS = POWER_W.hi  # per GPU (ampe.plausible): a GB200 superchip draws about 2.7 kW; 1e308 W would make inf joules


def watts(text: str) -> float:
    """argparse type: a power in watts per GPU, 0..MAX_WATTS."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text[:20]!r}") from None
    if not 0 <= v <= MAX_WATTS:  # NaN fails too
        raise argparse.ArgumentTypeError(f"must be 0..{MAX_WATTS:g} W per GPU, got {text[:20]}")
    return v


MAX_FACTOR = 100.0  # a straggler 100× slower than its pipeline is a broken machine, not a plan


def factor(text: str) -> float:
    """argparse type: a slow-down factor, 1..MAX_FACTOR."""
    v = positive_float(text)
    if not 1 <= v <= MAX_FACTOR:
        raise argparse.ArgumentTypeError(f"must be from 1 to {MAX_FACTOR:g}, got {text[:20]}")
    return v


def int_list(text: str) -> list[int]:
    """argparse type: comma-separated positive integers, e.g. ``1,2,4``."""
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"need positive integers, got {text!r}")
    return vals


def add_inputs(p: argparse.ArgumentParser, profile: bool = True) -> None:
    """--cluster, --model and (optionally) --profile."""
    p.add_argument("--cluster", required=True, metavar="SPEC.yaml", help="cluster spec (YAML)")
    p.add_argument("--model", required=True, metavar="NAME|MODEL.yaml|config.json",
                   help="zoo model name, model YAML, or a Hugging Face config.json (llama, mistral, qwen2, gpt2)")
    p.add_argument("--attention", choices=("auto", "eager", "flash"), default="auto",
                   help="attention kernel: flash (FlashAttention/SDPA, no s² score memory) or eager; auto: the "
                   "model's default (flash for 16-bit Llama-family models, eager for the GPT zoo and fp32)")
    add_seq_len(p)
    if profile:
        p.add_argument("--profile", metavar="PROFILE.csv", help="measured per-layer profile (CSV)")


def add_seq_len(p: argparse.ArgumentParser) -> None:
    """--seq-len (a Hugging Face config's sequence length)."""
    p.add_argument("--seq-len", type=positive_int, default=None, metavar="TOKENS",
                   help="sequence length of a Hugging Face config.json, up to its context (max_position_embeddings; "
                   "default: the context, at most 4096, with a note when that cuts it); a plan records it")


def load_model_arg(args: argparse.Namespace) -> Model:
    """The model named by --model (with --attention and --seq-len where the command has them); a note on stderr
    when a Hugging Face config's context is cut to the default sequence length."""
    from ampe.costmodel.zoo import context_cut, load_model

    attention = getattr(args, "attention", "auto")
    seq_len = getattr(args, "seq_len", None)
    model = load_model(args.model, None if attention == "auto" else attention, seq_len=seq_len)
    note = context_cut(args.model, seq_len)
    if note:
        print(note, file=sys.stderr)
    return model


def load_inputs(args: argparse.Namespace) -> tuple[Cluster, Model, Profile | None]:
    """Load and cross-check cluster, model and profile named on the command line."""
    from ampe.costmodel.cluster import load_cluster
    from ampe.costmodel.profile import load_profile

    cluster = load_cluster(args.cluster)
    model = load_model_arg(args)
    profile = None
    if getattr(args, "profile", None):
        profile = load_profile(args.profile, known_devices=[g.name for g in cluster.gpu_types()])
        if model.name not in profile.models():
            raise InputError(args.profile, "model", f"no rows for model {model.name!r} (it has: "
                             f"{', '.join(sorted(profile.models()))})")
        bad = sorted(k for k in profile.all_keys() if k[0] == model.name and k[3] >= model.num_layers)
        if bad:
            raise InputError(args.profile, "layer", f"layer {bad[0][3]} does not exist in {model.name} "
                             f"({model.num_layers} layers)")
    return cluster, model, profile


def say_profile(profile: Profile | None, model: Model) -> None:
    """Print what the cost model takes from the profile for ``model`` (layers, devices, attention kernel, measured
    recomputation) on stdout, and a warning on stderr about rows of another attention kernel it leaves out."""
    if profile is None:
        return
    line, warning = profile.describe(model)
    print(line)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)


def calibration_sidecar(path: str | None, profile: Profile | None) -> str | None:
    """The calibration sidecar (``ampe report --calibrate``) that came with the profile at ``path``, or None."""
    if profile is None or profile.calibration is None:
        return None
    from ampe.formats.calibration import SIDECAR_SUFFIX

    return f"{path}{SIDECAR_SUFFIX}"


def calibration_note(path: str | None, profile: Profile | None, amp: bool = False) -> str | None:
    """The line saying that a calibrated profile's sidecar is applied, or None. ``amp``: AMP's own cost model
    ranks, which reads the CSV's times only."""
    sidecar = calibration_sidecar(path, profile)
    if sidecar is None:
        return None
    if amp:
        return (f"calibration: {sidecar} found; AMP's model (--cost-model amp) uses only the CSV's calibrated times, "
                "the ampe columns also its instruction costs and link efficiencies")
    return (f"calibration: {sidecar} applied (compute factors and the micro-batch exponent are in the CSV's times; "
            "instruction costs and link efficiencies come from the sidecar)" + _cautions(sidecar))


def _cautions(sidecar: str) -> str:
    """`` — caution: ...`` with the cautions the calibration was written with (none: "")."""
    from ampe.formats.calibration import CalibrationFile
    from ampe.io import read_json

    fit = CalibrationFile.parse(read_json(sidecar), sidecar).fit
    return "" if fit is None or not fit.cautions else " — caution: " + "; ".join(fit.cautions)


def gib(nbytes: float) -> str:
    """Bytes as GiB with two decimals."""
    return f"{nbytes / GiB:.2f}"


def fits_label(est: Estimate, why: bool = False) -> str:
    """Whether an estimate's strategy fits in memory, for a table: ``yes`` (footprint + reserve within every
    device's capacity), ``at risk`` (within capacity, not within the reserve) or ``NO (OOM)``; with ``why``, the
    device and figures behind the last two."""
    if est.fits:
        return "yes"
    if est.within_capacity:
        return f"at risk: {est.memory_risk}" if why else "at risk"
    return f"NO: {est.oom_reason}" if why else "NO (OOM)"


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], file=None) -> None:
    """A readable table (rich when available; plain text otherwise)."""
    out = file or sys.stdout
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover - rich is a core dependency
        out.write(title + "\n" + "\t".join(columns) + "\n")
        for r in rows:
            out.write("\t".join(str(x) for x in r) + "\n")
        return
    from rich.markup import escape

    # cells are data, never markup: a name such as link_efficiency[inter] must print whole
    table = Table(title=escape(title), title_justify="left")
    for c in columns:
        table.add_column(escape(c), overflow="fold")
    for r in rows:
        table.add_row(*[escape(str(x)) for x in r])
    width = max(100, min(200, _term_width()))
    if _piped(out):  # no terminal to fit: as wide as the cells, so no word (pp2·dp1·tp1·mbs4) is cut in two
        width = max(width, Console(width=10_000).measure(table).maximum)
    Console(file=out, width=width).print(table)


def _term_width() -> int:
    import shutil

    return shutil.get_terminal_size((140, 40)).columns


def _piped(out: Any) -> bool:
    """Output that goes to no terminal (a pipe or file) and no ``COLUMNS`` asks for a width."""
    import os

    try:
        return not out.isatty() and not os.environ.get("COLUMNS")
    except (AttributeError, ValueError):
        return False


def draw_timeline(path: str, dag: Any, choice: Any, gpus: Sequence[Any] | None, title: str) -> Any:
    """Draw one clock choice's pipeline timeline (``ampe search/frontier --timeline``, PNG) and say where.

    With ``gpus`` (each stage's GPU type) every stage is coloured against its own type's maximum clock and named with
    its type; without them (a bare measured profile) bars are coloured in MHz over the DAG's clock range. Returns the
    :class:`ampe.energy.timeline.ClockTimeline` drawn.
    """
    from ampe.energy.timeline import timeline
    from ampe.viz import timeline_plot

    drawn = timeline(dag, choice, gpus=gpus or None)
    clocks = [o.mhz for spec in dag.specs for o in spec.options if o.mhz > 0]
    timeline_plot(path, drawn, title, (min(clocks), max(clocks)) if clocks else None)
    print(f"timeline: {path}")
    return drawn
