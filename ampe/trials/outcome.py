"""Turn what a finished trial left behind (exit codes, worker files, launcher log) into a status and measurements.

Decision order (``docs/trials.md``, "How a trial's status is decided"):

1. stopped by the user → ``interrupted``;
2. ``result.json`` with ``"status": "ok"`` and every process exited 0 → ``ok``;
3. an ``error_rank{R}.json`` of kind ``oom``, or any failure text that says out of memory → ``oom``;
4. a rank (or the launcher) ended by a signal the runner did not send → ``killed`` (torchrun's "Root Cause" block
   names the rank);
5. an ``error_rank{R}.json`` of another kind → ``crash`` with its message;
6. the trial ran past its timeout → ``timeout``;
7. anything else → ``crash`` with the log's last line.

Out-of-memory wins over the other failures because the other ranks of a job usually fail *because* one rank died
(their collectives break); the signal is next because a SIGKILLed rank writes no error file.
"""

from __future__ import annotations

import json
import re
import signal
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ampe.errors import InputError
from ampe.formats._base import FileModel
from ampe.formats.trial import Status
from ampe.formats.worker import Progress, RankReport, WorkerError, WorkerResult

OOM_TEXT = re.compile(r"out of memory|MemoryError|std::bad_alloc|Cannot allocate memory|OutOfMemory", re.I)
# Under an address-space limit, thread creation fails first (its stack cannot be mapped): EAGAIN.
LIMIT_TEXT = re.compile(r"Resource temporarily unavailable|can't start new thread", re.I)
_ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)
_ANY_EXIT = re.compile(r"rank\s*:\s*(\d+)[^\n]*\n[^\n]*\n?\s*exitcode\s*:\s*(-\d+)")
_REASON_CHARS = 300


@dataclass(frozen=True)
class Outcome:
    """Status, a one-line reason, the rank blamed, and the worker's measurements when it succeeded."""

    status: Status
    reason: str | None = None
    failed_rank: int | None = None
    measured: dict[str, Any] = field(default_factory=dict)


def read_progress(job_dir: Path) -> tuple[int, int] | None:
    """(iteration, of) from the worker's progress.json, or None when absent or unreadable (mid-rename)."""
    p = _read_model(job_dir / "progress.json", Progress)
    return (p.iteration, p.of) if isinstance(p, Progress) else None


M = TypeVar("M", bound=FileModel)


def _read_model(path: Path, model: type[M]) -> M | str | None:
    """The file validated by ``model``; None when it does not exist; a one-line reason when it is unusable."""
    if not path.exists():
        return None
    try:
        return model.parse(json.loads(path.read_text()), path.name)
    except (OSError, ValueError) as e:
        return f"unreadable {path.name} ({e})"
    except InputError as e:
        return f"{path.name}: {e.field}: {e.message}"


def classify(job_dir: Path, returncodes: list[int | None], log_text: str, *, timed_out: bool = False,
             interrupted: bool = False, local_ranks: bool = False, memory_limited: bool = False) -> Outcome:
    """Decide a trial's outcome. ``returncodes``: the launcher's exit status, or one per rank when ``local_ranks``
    (negative = killed by that signal; None = still running when the runner stopped the trial);
    ``log_text``: the tail of the launcher log as it was before the runner signalled anything (so the runner's own
    SIGTERMs are never blamed on a rank); ``memory_limited``: the ranks ran under ``--memory-limit``, so a failure to
    create a thread (EAGAIN) is out of memory too."""
    if interrupted:
        return Outcome("interrupted", "stopped by the user (SIGINT/SIGTERM to the runner)" + _progress_note(job_dir))
    result, bad = _read_result(job_dir)
    if result is not None and not timed_out and all(c == 0 for c in returncodes):
        measured, problem = measurements(job_dir, result)
        if problem is None:
            return Outcome("ok", measured=measured)
        bad = problem
    errors = _error_files(job_dir)

    def says_oom(text: str) -> bool:
        return bool(OOM_TEXT.search(text) or (memory_limited and LIMIT_TEXT.search(text)))

    oom = [(r, e) for r, e in errors if e.kind == "oom" or says_oom(e.message)]
    if oom:
        r, e = oom[0]
        note = "" if e.kind == "oom" or OOM_TEXT.search(e.message) else \
            " (under --memory-limit: a thread stack could not be mapped)"
        return Outcome("oom", f"rank {r}: {_one_line(e.message)}{note}", r)
    signalled = _signalled_rank(returncodes, log_text, local_ranks)
    if signalled is not None:
        rank, sig = signalled
        who = f"rank {rank}" if rank is not None else "the launcher"
        note = " (the kernel's OOM killer also sends SIGKILL)" if sig == signal.SIGKILL else ""
        return Outcome("killed", f"{who} was killed by {_signame(sig)}{note}", rank)
    hung = "; the other ranks then hung until the trial timeout" if timed_out else ""
    if errors:
        r, e = errors[0]
        return Outcome("crash", f"rank {r}: {_one_line(e.message)}{hung}", r)
    if says_oom(log_text):
        return Outcome("oom", "launcher log: " + _one_line(_last_match_line(log_text, memory_limited)) + hung)
    if timed_out:
        return Outcome("timeout", "no exit before the trial timeout; all processes were killed"
                       + _progress_note(job_dir))
    if bad:
        return Outcome("crash", bad)
    codes = [c for c in returncodes if c not in (None, 0)]
    last = _last_line(log_text)
    why = f"exit status {codes[0]}" if codes else "exited without result.json"
    return Outcome("crash", f"{why}: {last}" if last else why)


def measurements(job_dir: Path, result: WorkerResult) -> tuple[dict[str, Any], str | None]:
    """The figures of a successful trial from result.json (and rank*.json where result.json lacks them).
    Returns (fields, problem); ``problem`` names what makes the result unusable."""
    iters = [float(x) for x in result.iteration_s]
    std: float | None
    if iters:
        mean, std = statistics.fmean(iters), statistics.pstdev(iters)
    elif result.iteration_s_mean is not None:
        mean, std = result.iteration_s_mean, result.iteration_s_std
    else:
        return {}, "worker wrote a result.json without iteration times"
    # the real worker gathers every rank's report into result.json (works across hosts); else the rank files
    ranks = [(r.rank, r) for r in result.ranks] if result.ranks is not None else _rank_files(job_dir)
    peaks = result.peak_memory_bytes_per_rank
    if peaks is None:
        peaks = [r.peak_memory_bytes for _, r in ranks]
    reserved = result.peak_reserved_bytes_per_rank
    if reserved is None:
        reserved = [r.peak_reserved_bytes for _, r in ranks]
    used = result.peak_device_used_bytes_per_rank
    if used is None:
        used = [r.peak_device_used_bytes for _, r in ranks]
    mem_src = result.memory_source or next((r.memory_source for _, r in ranks if r.memory_source), None)
    used_src = result.device_used_source or next((r.device_used_source for _, r in ranks if r.device_used_source),
                                                 None)
    ok_flags = [r.instructions_ok for _, r in ranks if r.instructions_ok is not None]
    instructions_ok = result.instructions_ok if result.instructions_ok is not None else (
        all(ok_flags) if ok_flags else None)
    extra = result.extras()  # rank*.json keep the rest
    emulated = [r.emulated for _, r in ranks if r.emulated]
    if emulated and "emulated" not in extra:
        extra["emulated_per_rank"] = emulated
    mismatch = [r.instruction_mismatch for _, r in ranks if r.instruction_mismatch]
    if mismatch:
        extra["instruction_mismatch"] = mismatch[0]
    energy = result.energy_j_per_iter
    return {
        "iteration_s": tuple(iters),
        "iteration_s_mean": float(mean),
        "iteration_s_std": None if std is None else float(std),
        "peak_memory_bytes_per_rank": tuple(peaks),
        "memory_source": mem_src,
        "peak_reserved_bytes_per_rank": tuple(reserved) if any(v is not None for v in reserved) else (),
        "peak_device_used_bytes_per_rank": tuple(used) if any(v is not None for v in used) else (),
        "device_used_source": used_src,
        "energy_j_per_iter": energy,
        "energy_source": result.energy_source if energy is not None else None,
        "plan_applied": result.plan_applied,
        "instructions_ok": instructions_ok,
        "worker": extra,
    }, None


def _read_result(job_dir: Path) -> tuple[WorkerResult | None, str | None]:
    path = job_dir / "result.json"
    if not path.exists():
        return None, None
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return None, f"worker wrote an unreadable result.json ({e})"
    if not isinstance(raw, dict) or raw.get("status") != "ok":
        return None, f"result.json says status {raw.get('status') if isinstance(raw, dict) else raw!r}"
    parsed = _read_model(path, WorkerResult)
    if isinstance(parsed, str):
        return None, f"worker wrote an unusable result.json ({parsed})"
    return parsed, None


def _error_files(job_dir: Path) -> list[tuple[int, WorkerError]]:
    out = []
    for rank, p in _per_rank_files(job_dir, "error_rank"):
        e = _read_model(p, WorkerError)
        out.append((rank, e if isinstance(e, WorkerError) else WorkerError(kind="crash", message=str(e))))
    return out


def _rank_files(job_dir: Path) -> list[tuple[int, RankReport]]:
    out = []
    for rank, p in _per_rank_files(job_dir, "rank"):
        r = _read_model(p, RankReport)
        if isinstance(r, RankReport):
            out.append((rank, r))
    return out


def _per_rank_files(job_dir: Path, prefix: str) -> list[tuple[int, Path]]:
    """(rank, path) of every ``{prefix}{R}.json``, by rank."""
    out = []
    for p in job_dir.glob(f"{prefix}*.json"):
        m = re.fullmatch(rf"{prefix}(\d+)\.json", p.name)
        if m:
            out.append((int(m.group(1)), p))
    return sorted(out)


def _signalled_rank(returncodes: list[int | None], log_text: str, local_ranks: bool) -> tuple[int | None, int] | None:
    """(rank or None for the launcher, signal number) of a process that died from a signal."""
    for i, c in enumerate(returncodes):
        if c is not None and c < 0:
            return (i if local_ranks else None), -c
    if local_ranks:
        return None
    m = _ROOT_CAUSE.search(log_text)  # torchrun's ChildFailedError summary names the first failure
    if m:
        code = int(m.group(2))
        return (int(m.group(1)), -code) if code < 0 else None  # other ranks' SIGTERMs are torchrun's own
    m = _ANY_EXIT.search(log_text)
    if m:
        return int(m.group(1)), -int(m.group(2))
    return None


def _progress_note(job_dir: Path) -> str:
    p = read_progress(job_dir)
    return f" (last progress: iteration {p[0]} of {p[1]})" if p else " (no progress reported)"


def _signame(sig: int) -> str:
    try:
        return f"signal {sig} ({signal.Signals(sig).name})"
    except ValueError:
        return f"signal {sig}"


def _one_line(text: Any) -> str:
    s = " ".join(str(text or "no message").split())
    return s if len(s) <= _REASON_CHARS else s[: _REASON_CHARS - 1] + "…"


def _last_line(text: str) -> str:
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    return _one_line(lines[-1]) if lines else ""


def _last_match_line(text: str, memory_limited: bool) -> str:
    lines = [l for l in text.splitlines() if OOM_TEXT.search(l) or (memory_limited and LIMIT_TEXT.search(l))]
    return lines[-1] if lines else ""
