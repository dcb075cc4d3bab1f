"""Trial results: the folder that keeps :class:`~ampe.formats.trial.TrialResult` records across runs.

Folder layout (``ampe trial --out DIR``)::

    DIR/results.jsonl   one JSON line per finished (or interrupted) trial, appended with fsync — the source of truth
    DIR/summary.json    the latest record per trial key plus the trials skipped this run, rewritten atomically
    DIR/summary.csv     the same as a flat table
    DIR/plan.json       copy of the plan the trials came from (the report reads predictions from it)
    DIR/trials/ID/      the job file, launcher log and the worker's outputs of one trial

A line is written with one ``write`` call on an ``O_APPEND`` descriptor while SIGINT is blocked, then fsync'd, so a
Ctrl-C or a crash leaves at most a truncated *last* line; the reader ignores it and the next append cuts it off.
A later record for the same key supersedes an earlier one (an interrupted trial that was rerun).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import signal
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from ampe.errors import OutputError, os_reason
from ampe.formats.trial import TrialResult, result_from_dict
from ampe.io import json_text, parse_json, read_text
from ampe.outfolder import OutputFolder

SUMMARY_SCHEMA = "ampe.trials/1"
RESULTS_FILE = "results.jsonl"
SUMMARY_JSON = "summary.json"
SUMMARY_CSV = "summary.csv"


def trial_key(parts: Mapping[str, Any]) -> str:
    """Stable identity of a trial: SHA-256 (16 hex digits) of its canonical JSON (strategy, model, cluster, backend,
    schedule, iterations, dtype, device). Predictions are not part of it, so a recalibrated plan reuses
    measurements of the same strategies."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class ResultsStore:
    """The results folder of one ``ampe trial --out DIR``: append-only JSONL plus rewritten summaries."""

    def __init__(self, out_dir: str | Path, folder: OutputFolder | None = None) -> None:
        """``folder``: the results folder already opened for writing (the runner's); else it is opened (created) at
        the first write. Writes never go through a link inside it (:mod:`ampe.outfolder`): a ``results.jsonl``
        that is a link is refused, summaries replace a link in their place."""
        self.dir = Path(out_dir)
        self.path = self.dir / RESULTS_FILE
        self._folder = folder
        if folder is not None and self.path.is_symlink():  # refused before any trial runs, not at its first record
            raise OutputError(str(self.path), "", "is a symbolic link; ampe appends only to a regular file in its "
                              "folder (remove the link)")

    def _out(self) -> OutputFolder:
        if self._folder is None:
            self._folder = OutputFolder(self.dir, "--out")
        return self._folder

    def load(self) -> list[TrialResult]:
        """Every record in file order. A truncated last line (a crash mid-write) is ignored; any other bad line is
        an InputError naming the line."""
        if not self.path.exists() and not self.path.is_symlink():
            return []
        text = read_text(self.path)  # a regular file of bounded size, or a one-line InputError
        complete = text.split("\n")[:-1]  # text after the last newline is a write that never finished
        out = []
        for no, line in enumerate(complete, start=1):
            if not line.strip():
                continue
            rec = parse_json(line, f"{self.path} line {no}")
            out.append(result_from_dict(rec, str(self.path), f"line {no}"))
        return out

    def latest(self) -> dict[str, TrialResult]:
        """The last record per trial key."""
        out: dict[str, TrialResult] = {}
        for r in self.load():
            out[r.key] = r
        return out

    def append(self, result: TrialResult) -> None:
        """Append one record durably (single write, fsync) with SIGINT held off so the line is never cut."""
        line = (json.dumps(result.to_dict(), allow_nan=False, separators=(",", ":")) + "\n").encode()
        try:
            with _SignalsBlocked():
                fd = self._out().open_append(RESULTS_FILE, read=True)
                try:
                    _cut_unfinished_line(fd)
                    view = memoryview(line)
                    while view:
                        n = os.write(fd, view)
                        view = view[n:]
                    os.fsync(fd)
                finally:
                    os.close(fd)
        except OSError as e:  # a full disk: one line; a cut line is dropped by the next append or load
            raise OutputError(str(self.path), "", f"cannot append the trial's record ({os_reason(e)})") from None

    def write_summary(self, skipped: Sequence[TrialResult] = (), extra: Mapping[str, Any] | None = None) -> None:
        """Rewrite summary.json and summary.csv from the latest records (plus this run's skipped trials)."""
        latest = sorted(self.latest().values(), key=_order)
        done_keys = {r.key for r in latest}
        skipped = [s for s in skipped if s.key not in done_keys]
        counts: dict[str, int] = {}
        for r in (*latest, *skipped):
            counts[r.status] = counts.get(r.status, 0) + 1
        summary = {"schema": SUMMARY_SCHEMA, "counts": counts, **(dict(extra) if extra else {}),
                   "trials": [r.to_dict() for r in latest], "skipped": [r.to_dict() for r in skipped]}
        with _SignalsBlocked():
            text = json_text(summary) + "\n"
            out = self._out()
            out.write_text(SUMMARY_JSON, text, fsync=True)
            out.write_text(SUMMARY_CSV, results_csv([*latest, *skipped]), fsync=True)


CSV_COLUMNS = (
    "trial_id", "plan_rank", "pp", "dp", "tp", "mbs", "gas", "shares", "recompute", "zero", "attention", "dtype",
    "expandable_segments", "freq_backend", "schedule_applied", "status", "reason",
    "predicted_iteration_s", "iteration_s_mean", "iteration_s_std", "predicted_max_memory_bytes",
    "peak_memory_bytes", "memory_source", "peak_reserved_bytes", "peak_device_used_bytes", "predicted_fits",
    "caveats", "predicted_energy_j", "energy_j_per_iter",
    "energy_source", "wall_s", "key", "baseline_key",
)


def results_csv(results: Iterable[TrialResult]) -> str:
    """The summary table as CSV text (one row per trial, columns :data:`CSV_COLUMNS`)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for r in results:
        s = r.strategy
        per = s.get("stage_recompute")
        row = {**r.to_dict(), **{k: s.get(k) for k in ("pp", "dp", "tp", "mbs", "gas", "attention", "dtype",
                                                        "expandable_segments")},
               "recompute": "/".join(map(str, per)) if isinstance(per, list) else s.get("recompute", "none"),
               "zero": s.get("zero", 0), "peak_memory_bytes": r.peak_memory_bytes,
               "shares": ":".join(map(str, r.shares)),
               "peak_reserved_bytes": r.peak_reserved_bytes, "peak_device_used_bytes": r.peak_device_used_bytes,
               "caveats": ",".join(c.label for c in r.predicted_caveats)}
        w.writerow(["" if row.get(c) is None else row.get(c) for c in CSV_COLUMNS])
    return buf.getvalue()


def _order(r: TrialResult) -> tuple:
    return (r.plan_rank, r.schedule_applied, r.trial_id)


def json_safe(obj: Any) -> Any:
    """A copy with tuples as lists and NaN/inf as None, so the JSON stays strict."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def _cut_unfinished_line(fd: int) -> None:
    """If the file does not end in a newline (a write was cut), truncate back to the last newline."""
    size = os.fstat(fd).st_size
    if size == 0:
        return
    if os.pread(fd, 1, size - 1) == b"\n":
        return
    pos = size
    chunk = 4096
    while pos > 0:
        start = max(0, pos - chunk)
        buf = os.pread(fd, pos - start, start)
        i = buf.rfind(b"\n")
        if i >= 0:
            os.ftruncate(fd, start + i + 1)
            return
        pos = start
    os.ftruncate(fd, 0)


class _SignalsBlocked:
    """Hold SIGINT/SIGTERM while a record is written (delivered right after); a no-op off the main thread."""

    _SIGNALS: ClassVar[set[signal.Signals]] = {signal.SIGINT, signal.SIGTERM}

    def __enter__(self) -> None:
        self._old: set[int | signal.Signals] | None
        try:
            self._old = signal.pthread_sigmask(signal.SIG_BLOCK, self._SIGNALS)
        except (AttributeError, ValueError, OSError):  # pragma: no cover - non-POSIX
            self._old = None

    def __exit__(self, *exc: object) -> None:
        if self._old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self._old)
