"""``ampe dvfs fit``: fit the DVFS model of a GPU type to a per-clock profile; write a cluster-spec block."""

from __future__ import annotations

import argparse
import sys
import warnings

from ampe.cli._common import positive_int, watts
from ampe.errors import InputError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dvfs", help="the DVFS (clock → time, power) model of GPU types",
                       description="Fit the analytic DVFS model to measured per-clock data (docs/energy.md §1).")
    verbs = p.add_subparsers(dest="dvfs_command", metavar="VERB", parser_class=type(p), help="fit")
    f = verbs.add_parser("fit", help="fit a GPU type's model to a per-clock profile CSV",
                         description="Fit time and power against SM clock to a per-clock profile "
                         "(stage,instruction,frequency,time,energy in MHz, s, J; Perseus/Zeus format) and write the "
                         "`gpu_types:` block that gives a cluster spec's GPU type these parameters.")
    f.add_argument("--profile", required=True, metavar="CSV", help="per-clock profile CSV")
    f.add_argument("--gpu", required=True, metavar="TYPE", help="catalog GPU type the profile was measured on")
    f.add_argument("--blocking-power", type=watts, default=None, metavar="W",
                   help="watts while waiting on communication (default: the catalog model's)")
    f.add_argument("--gpus", type=positive_int, default=1, metavar="N",
                   help="GPUs whose energy each row sums, e.g. a tensor-parallel stage's (default 1)")
    f.add_argument("--out", metavar="F.yaml", help="write the block here (default: standard output)")
    f.set_defaults(func=run)
    p.set_defaults(func=lambda args: (p.print_help(sys.stderr), 2)[1])


def _check_loadable(text: str, gpu: str, profile: str) -> None:
    """Refuse to write a ``gpu_types:`` block the cluster-spec loader would refuse (``--gpus 100000`` fits 0 W busy
    power): it is loaded here, in a one-node spec, exactly as a spec holding it would be."""
    from ampe.costmodel.cluster import cluster_from_dict
    from ampe.parsers import parse_yaml

    block = parse_yaml(text, "(the fitted block)")
    node = {"name": "n", "gpu": gpu, "count": 1, "intra_gbps": 100, "inter_gbps": 10}
    try:
        cluster_from_dict({"name": "fit-check", "nodes": [node], **block}, "(the fitted block)")
    except InputError as e:
        raise InputError(profile, e.field, f"the fitted parameters are not a valid GPU type ({e.message}); check "
                         "the profile and --gpus (GPUs whose energy each row sums)") from None


def run(args: argparse.Namespace) -> int:
    from ampe.costmodel.catalog import CATALOG
    from ampe.energy.dvfs_fit import fit_profile
    from ampe.io import write_text_atomic

    gpu = CATALOG.get(args.gpu)
    if gpu is not None and args.blocking_power is not None and args.blocking_power > gpu.tdp_w:
        raise InputError("--blocking-power", "", f"{args.blocking_power:g} W is above {gpu.name}'s TDP "
                         f"({gpu.tdp_w:g} W); a GPU waiting on communication draws less than at full load")
    try:
        with warnings.catch_warnings():  # overflow on absurd values: the one line below says it, not numpy's lines
            warnings.simplefilter("ignore", RuntimeWarning)
            result = fit_profile(args.profile, args.gpu, args.blocking_power, args.gpus)
    except (ValueError, ArithmeticError) as failure:  # numpy/scipy on values no GPU measures (1e308 s overflows)
        raise InputError(args.profile, "time", f"the fit failed on these values ({str(failure)[:80]}); times and "
                         "energies must be what a GPU measures (s, J)") from None
    text = result.gpu_types_yaml()
    _check_loadable(text, result.gpu.name, args.profile)
    e = result.error
    summary = (f"{result.gpu.name}: {e.sweeps} computations, {e.points} points; mean error time "
               f"{100 * e.time_err:.1f}%, energy {100 * e.energy_err:.1f}%; best saving per computation measured "
               f"{100 * e.measured_saving:.1f}%, predicted {100 * e.predicted_saving:.1f}%")
    if args.out:
        write_text_atomic(args.out, text)
        print(summary)
        print(f"wrote {args.out} (paste its gpu_types: block into a cluster spec)")
    else:
        sys.stdout.write(text)
        sys.stderr.write(summary + "\n")
    return 0
