"""A plan's inputs are the plan's: where its files are and whether they are still what it was made from.

Paths: a plan records its input files (cluster spec, profile, calibration sidecar, model YAML) relative to the plan's
own folder, with ``inputs.relative_to: plan`` (:func:`recorded_inputs`, called as a plan is written), so a plan
moved together with its inputs, or read from another folder, finds its own files and never a namesake in the
current folder. A plan without that marker (written before it) was recorded with paths as typed on the search's
command line: those are looked up in the plan's folder first, then, where missing there, in the current folder.

Contents: each input file's SHA-256 is stored in ``inputs.sha256`` (field → hex digest). On reading
(:func:`check_unchanged`) a file whose content differs is named in one line and refused, never silently re-read:
whatever prices or times the plan (links, prices, speeds, stragglers in a spec; a profile's times) is covered, not
only the device list. Plans without hashes read as before.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ampe.errors import InputError
from ampe.io import MAX_INPUT_BYTES, exists, path_problem

PATH_FIELDS = ("cluster_spec", "profile", "calibration", "model")  # model: only where it names a file
RELATIVE_TO_PLAN = "plan"


def model_names_file(value: str) -> bool:
    """Whether a plan's ``inputs.model`` names a file (a model YAML or config.json) rather than a zoo model."""
    return value.endswith((".yaml", ".yml", ".json")) or "/" in value or os.sep in value


def _names_file(field: str, value: str) -> bool:
    """Whether an input field's value names a file (a model may be a zoo name instead)."""
    return field != "model" or model_names_file(value)


def input_path(value: str, plan_path: str, relative_to: str | None) -> str:
    """Where the plan input ``value`` is: absolute as given; else in the plan's folder (a plan marked
    ``relative_to: plan`` looks nowhere else; an older plan then tries the current folder). Raises InputError for a
    name no file can have."""
    bad = path_problem(value)
    if bad:
        raise InputError(plan_path, "inputs", f"{value!r} is not a usable file name: {bad}")
    p = Path(value)
    if p.is_absolute():
        return value
    here = Path(plan_path).parent / p
    if relative_to == RELATIVE_TO_PLAN or exists(here) or not exists(p):
        return str(here)
    return str(p)  # an older plan, its paths typed relative to where its search ran


def file_inputs(inputs: Mapping[str, Any], plan_path: str) -> Iterator[tuple[str, str]]:
    """(field, resolved path) of each input file a plan names."""
    relative_to = inputs.get("relative_to")
    for field in PATH_FIELDS:
        value = inputs.get(field)
        if isinstance(value, str) and value and value != "(not written)" and _names_file(field, value):
            yield field, input_path(value, plan_path, relative_to)


def content_hash(path: str) -> str | None:
    """SHA-256 (hex) of a regular file of at most MAX_INPUT_BYTES, or None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            if not os.path.isfile(path):
                return None
            data = f.read(MAX_INPUT_BYTES + 1)
    except (OSError, ValueError):
        return None
    return hashlib.sha256(data).hexdigest()


def check_unchanged(inputs: Mapping[str, Any], plan_path: str, skip: tuple[str, ...] = ()) -> None:
    """Refuse a plan whose input files changed since it was made (their hashes in ``inputs.sha256``; fields in
    ``skip`` are not checked, e.g. a cluster spec the command replaces). A missing file is left to its loader."""
    hashes = inputs.get("sha256") or {}
    for field, path in file_inputs(inputs, plan_path):
        want = hashes.get(field) if isinstance(hashes, Mapping) else None
        if field not in skip:
            check_file_unchanged(plan_path, field, path, want)


def check_file_unchanged(plan_path: str, field: str, path: str, want: str | None) -> None:
    """Refuse input ``field`` of the plan at ``plan_path`` when file ``path`` no longer has the SHA-256 ``want`` the
    plan stores (None: an older plan, nothing to compare). A missing file is left to its loader."""
    have = content_hash(path) if want else None
    if have is not None and have != want:
        raise InputError(plan_path, f"inputs.{field}", f"{path} changed since the plan was made (its content differs "
                         "from the hash the plan stores); re-run the search, or restore the file")


def recorded_inputs(inputs: Mapping[str, Any], plan_out: str | None) -> dict[str, Any]:
    """``inputs`` as a plan written to ``plan_out`` records them: input files relative to that plan's folder (the
    current folder for standard output or none), with their hashes and ``relative_to: plan``. ``inputs``' paths
    are absolute or relative to the current folder."""
    base = os.path.dirname(os.path.abspath(plan_out)) if plan_out and plan_out != "-" else os.getcwd()
    out = dict(inputs)
    hashes: dict[str, str] = {}
    for field in PATH_FIELDS:
        value = out.get(field)
        if not (isinstance(value, str) and value and value != "(not written)" and _names_file(field, value)):
            continue
        if field == "model" and not exists(value):
            continue  # a zoo name with a slash in it, or no such file: kept as typed
        absolute = os.path.abspath(value)
        try:
            out[field] = absolute if os.path.isabs(value) else os.path.relpath(absolute, base)
        except ValueError:  # another drive (Windows): the absolute path
            out[field] = absolute
        digest = content_hash(absolute)
        if digest is not None:
            hashes[field] = digest
    out["relative_to"] = RELATIVE_TO_PLAN
    out["sha256"] = hashes
    return out


def absolute_inputs(inputs: Mapping[str, Any], plan_path: str) -> dict[str, Any]:
    """A read plan's ``inputs`` with its input files as absolute paths (for a re-plan written elsewhere); hashes and
    the ``relative_to`` marker are dropped (they are recorded again as the new plan is written)."""
    out = {k: v for k, v in inputs.items() if k not in ("sha256", "relative_to")}
    for field, path in file_inputs(inputs, plan_path):
        out[field] = os.path.abspath(path)
    return out
