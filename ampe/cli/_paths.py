"""Every command's file inputs and outputs, declared in one table, and the one rule over them: no output may name an
input or another output.

A command's outputs are checked before any work starts (:func:`check_paths`): each must be a usable output
(:func:`ampe.io.check_output_path`, a picture's suffix, a folder for ``export``/``trial --out``), no two outputs may be
one file, and no output may be one of the command's inputs: the same name, a symbolic link to it or a hard link
(compared by resolved path, and by device and inode where both exist: :func:`ampe.io.same_file`). An output folder
counts by the files the command writes in it; an input folder by the files the command reads in it. A refusal is one
line, exit status 2, and nothing is read or written.

``tests/test_cli_paths.py`` tries every (input, output) pair of this table on every command, and checks that every
option taking a file name is declared here, so a new flag cannot escape the rule.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ampe.errors import InputError

FILE, PICTURE, FOLDER, NAME_OR_FILE = "file", "picture", "folder", "name or file"

# what `ampe export --out DIR` writes in DIR (ampe/trials/export.py)
EXPORT_FILES = ("export.json", "ds_config.json", "ds_config_replica*.json", "frequency_plan.json", "hostfile",
                ".deepspeed_env", "worker/job.json", "launch.sh", "launch_worker.sh", "commands.json", "README.md")
# what `ampe trial --out DIR` writes in DIR (ampe/trials/runner.py, results.py, lifetime.py); trials/ is emptied
TRIAL_FILES = ("plan.json", "results.jsonl", "summary.json", "summary.csv", ".ampe-trial.lock", "trials/")
# ampe.formats.calibration.SIDECAR_SUFFIX, spelled here so the check imports no pydantic (`frontier --profile` runs on
# numpy alone); tests/test_cli_paths.py keeps the two equal
SIDECAR_SUFFIX = ".calibration.json"
# what `ampe report DIR` reads in DIR (ampe/report/compare.py)
REPORT_READS = ("results.jsonl", "plan.json")


@dataclass(frozen=True)
class PathArg:
    """One option naming a file or folder. ``attr``: its argparse destination; ``flag``: as the user types it;
    ``kind``: FILE, PICTURE (an output whose suffix picks the format), FOLDER, or NAME_OR_FILE (a zoo model or module
    name, a file only where one exists); ``within``: for a folder, the files the command reads or writes in it (a
    name ending in ``/`` is a whole subfolder)."""

    attr: str
    flag: str
    kind: str = FILE
    within: tuple[str, ...] = ()


@dataclass(frozen=True)
class CommandPaths:
    """A command's file inputs and outputs."""

    inputs: tuple[PathArg, ...]
    outputs: tuple[PathArg, ...]


_CLUSTER, _PROFILE = PathArg("cluster", "--cluster"), PathArg("profile", "--profile")
_MODEL = PathArg("model", "--model", NAME_OR_FILE)
_PLAN = PathArg("plan", "--plan")

COMMANDS: dict[str, CommandPaths] = {
    "search": CommandPaths((_CLUSTER, _MODEL, _PROFILE),
                           (PathArg("out", "--out"), PathArg("plot", "--plot", PICTURE),
                            PathArg("timeline", "--timeline", PICTURE))),
    "evaluate": CommandPaths((_CLUSTER, _MODEL, _PROFILE, PathArg("strategy", "--strategy")),
                             (PathArg("json", "--json"),)),
    "frontier": CommandPaths((_PROFILE, _PLAN),
                             (PathArg("out", "--out"), PathArg("plot", "--plot", PICTURE),
                              PathArg("export_profile", "--export-profile"),
                              PathArg("timeline", "--timeline", PICTURE))),
    "replan": CommandPaths((_PLAN, PathArg("add", "--add")),
                           (PathArg("out", "--out"), PathArg("cluster_out", "--cluster-out"))),
    "report": CommandPaths((PathArg("dir", "DIR", FOLDER, REPORT_READS), PathArg("measurements", "--measurements"),
                            _CLUSTER, _MODEL, _PROFILE),
                           (PathArg("plot", "--plot", PICTURE), PathArg("calibrate", "--calibrate"),
                            PathArg("json", "--json"))),
    "dvfs": CommandPaths((_PROFILE,), (PathArg("out", "--out"),)),
    "export": CommandPaths((_PLAN, PathArg("host_map", "--host-map"), _CLUSTER,
                            PathArg("script", "--script", NAME_OR_FILE)),
                           (PathArg("out", "--out", FOLDER, EXPORT_FILES),)),
    "trial": CommandPaths((_PLAN, _CLUSTER, PathArg("host_map", "--host-map"),
                           PathArg("worker", "--worker", NAME_OR_FILE)),
                          (PathArg("out", "--out", FOLDER, TRIAL_FILES),)),
    "profile": CommandPaths((_MODEL, PathArg("merge", "--merge")), (PathArg("out", "--out"),)),
}


def check_paths(args: argparse.Namespace) -> None:
    """Refuse, before any work, an unusable output, two outputs that are one file, or an output that is an input
    (module docstring). Raises InputError naming the output's flag."""
    from ampe.io import STDOUT, check_output_path, check_picture_path
    from ampe.outfolder import check_folder

    paths = COMMANDS.get(getattr(args, "command", None) or "")
    if paths is None:
        return
    for out in paths.outputs:
        value = getattr(args, out.attr, None)
        if value is None:
            continue
        if out.kind == FOLDER:
            check_folder(value, out.flag)
        elif out.kind == PICTURE:
            check_picture_path(value, out.flag)
        else:
            check_output_path(value, out.flag)
    written = [(flag, name) for flag, name in _outputs(args, paths)]
    _check_distinct(written, STDOUT)
    read = list(_inputs(args, paths))
    for flag, name in written:
        check_not_input(flag, name, read)


def check_not_input(flag: str, name: str, inputs: Iterable[tuple[str, str]]) -> None:
    """Refuse output ``name`` (of option ``flag``) when it is one of ``inputs`` ((flag or field, file name) pairs),
    as a name, a symbolic link or a hard link: for outputs known only once an input is read (a plan's own inputs,
    ``replan``'s default ``--cluster-out``). Raises InputError."""
    from ampe.io import STDOUT

    if name == STDOUT:
        return
    for in_flag, in_name in inputs:
        if in_name and (_same(name, in_name) or _same(in_name, name)):
            raise InputError(flag, "", f"{name} is also the input {in_flag} ({in_name}); ampe never writes over an "
                             "input: name another file")


def _same(a: str, b: str) -> bool:
    from ampe.io import same_file

    return same_file(a, b)


def _check_distinct(outputs: list[tuple[str, str]], stdout: str) -> None:
    """Two outputs of one command may not be one file (``--out x.png --plot x.png`` kept only the plot); standard
    output (``-``) may take one output only."""
    for i, (flag, name) in enumerate(outputs):
        for other_flag, other in outputs[:i]:
            if (name == stdout and other == stdout) or (stdout not in (name, other) and _same(name, other)):
                what = "standard output" if name == stdout else name
                raise InputError(flag, "", f"{what} is also {other_flag}'s output; each output needs a file of its "
                                 "own")


def _values(args: argparse.Namespace, arg: PathArg) -> list[str]:
    value = getattr(args, arg.attr, None)
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]


def _outputs(args: argparse.Namespace, paths: CommandPaths) -> Iterator[tuple[str, str]]:
    """(flag, file name) of every file the command will write: an output folder's files, ``--calibrate``'s
    sidecar."""
    for out in paths.outputs:
        for value in _values(args, out):
            if out.kind == FOLDER:
                yield from ((f"{out.flag} ({inner})", path) for inner in out.within for path in _named(value, inner))
                continue
            yield out.flag, value
            if out.attr == "calibrate" and value != "-":
                yield f"{out.flag} (its sidecar)", f"{value}{SIDECAR_SUFFIX}"


def _named(folder: str, inner: str) -> list[str]:
    """``folder/inner``; for a pattern (one file per replica), the files in ``folder`` it matches now (only a file
    that exists can be an input)."""
    if "*" not in inner:
        return [os.path.join(folder, inner)]
    import glob

    return sorted(glob.glob(os.path.join(glob.escape(folder), inner)))


def _inputs(args: argparse.Namespace, paths: CommandPaths) -> Iterator[tuple[str, str]]:
    """(flag, file name) of every file the command reads: an input folder's files, a profile's calibration
    sidecar; a NAME_OR_FILE only where such a file exists."""
    from ampe.io import exists

    for arg in paths.inputs:
        for value in _values(args, arg):
            if arg.kind == NAME_OR_FILE and not exists(value):
                continue
            if arg.kind == FOLDER:
                yield from ((f"{arg.flag} ({inner})", os.path.join(value, inner)) for inner in arg.within)
                continue
            yield arg.flag, value
            if arg.attr == "profile":
                yield f"{arg.flag} (its calibration)", f"{value}{SIDECAR_SUFFIX}"
