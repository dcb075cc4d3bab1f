"""What ``benchmarks/gpu_check.sh`` measured, against what the cost model predicts for it now.

``python benchmarks/support/gpu_check_summary.py DATA_DIR [--record]`` prints a markdown table (one row per trial:
attention, recomputation, micro-batch, expandable segments, the kernel torch ran, predicted and measured time,
predicted allocated peak against the measured one (``max_memory_allocated``) and, where the record has them, the
reserved and device-used peaks, the predicted footprint against the device's capacity and whether it fits, energy) and
the
figures below it; ``--record`` also writes them to ``DATA_DIR/summary.json``, the figures
``tests/e2e/test_gpu_check.py`` holds the cost model to (its predictions may not get worse than when recorded).

Every trial is predicted again, now, as it ran: the stored model YAML with the trial's attention kernel and
precision, the stored cluster spec and the stored profile (``CostModel.estimate`` of its strategy record).

Every record shape is read: failed trials (OOM, crash, timeout: no measured time, maybe no memory), no energy, and
records from before the trial record had ``peak_reserved_bytes_per_rank``/``peak_device_used_bytes_per_rank`` or the
strategy ``expandable_segments`` (their cells stay empty).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.profile import load_profile
from ampe.costmodel.strategy import strategy_from_dict
from ampe.costmodel.zoo import load_model
from ampe.formats.trial import TrialResult
from ampe.report.compare import mape, spearman

GiB = float(1 << 30)


@dataclass(frozen=True)
class Row:
    """One trial: how it ran, what was measured, what the cost model predicts for it now (s, bytes, J)."""

    plan: str  # attention_recompute of the plan it came from
    attention: str
    recompute: str
    mbs: int
    status: str
    kernels: str
    predicted_s: float
    measured_s: float | None
    predicted_bytes: float  # the allocated peak (what max_memory_allocated measures: like with like)
    measured_bytes: float | None
    energy_j: float | None
    energy_source: str | None
    footprint_bytes: float = 0.0  # predicted footprint: allocated + allocator fragmentation + context
    capacity_bytes: float = 0.0  # the device's memory (the catalog's, or the cluster spec's)
    fits: str = ""  # yes (footprint + reserve within capacity), at risk (within capacity only) or no
    expandable_segments: str = ""  # on/off as the strategy ran; empty: not set (PyTorch's default, off)
    reserved_bytes: float | None = None  # the allocator's reserved peak, largest over ranks
    device_used_bytes: float | None = None  # the device's used-memory peak (all processes, context included)

    @property
    def time_err_pct(self) -> float | None:
        """(predicted − measured) / measured × 100."""
        return None if not self.measured_s else (self.predicted_s - self.measured_s) / self.measured_s * 100

    @property
    def memory_err_pct(self) -> float | None:
        """(predicted − measured) / measured × 100."""
        return None if not self.measured_bytes else (self.predicted_bytes - self.measured_bytes) / \
            self.measured_bytes * 100


def long_model(data: Path) -> Path:
    """The longest-sequence model YAML of the check (the one searched and trialled)."""
    return max(data.glob("s*.yaml"), key=lambda p: int(p.stem[1:]))


def _peak(record: dict[str, Any], field: str) -> float | None:
    """The largest per-rank figure of ``field`` (bytes), or None where the record has none (older records)."""
    vals = [v for v in record.get(field) or () if isinstance(v, int | float)]
    return float(max(vals)) if vals else None


def _known(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` without the fields this ampe's trial record lacks (a newer record's: read from the raw record)."""
    return {k: v for k, v in record.items() if k in TrialResult.model_fields or k == "schema"}


def _on_off(value: object) -> str:
    return "" if value is None else "on" if value else "off"


def rows(data: Path) -> list[Row]:
    """Every trial of the check, predicted again now."""
    model_path = long_model(data)
    cluster = load_cluster(data / "cluster.yaml")
    profile = load_profile(data / f"profile_{model_path.stem}.csv", known_devices=[g.name for g in
                                                                                   cluster.gpu_types()])
    base = load_model(str(model_path))
    cm = CostModel(cluster, base, profile)
    out = []
    for path in sorted(data.glob("trials_*.jsonl")):
        latest: dict[str, tuple[TrialResult, dict[str, Any]]] = {}
        for line in path.read_text().splitlines():
            if line.strip():
                raw = json.loads(line)
                r = TrialResult.parse(_known(raw), str(path))
                latest[r.key] = (r, raw)
        for r, raw in latest.values():
            if r.status == "skipped":
                continue
            est = cm.estimate(strategy_from_dict(r.strategy, str(path)))
            peak = max(est.memory_breakdown, key=lambda m: m.total)
            kernels = r.worker.get("attention_kernels") if isinstance(r.worker, dict) else None
            s = r.strategy
            out.append(Row(plan=path.stem.removeprefix("trials_"), attention=str(s.get("attention")),
                           recompute=str(s.get("recompute", "none")), mbs=int(s["mbs"]), status=r.status,
                           kernels=",".join(kernels) if isinstance(kernels, list) else "",
                           predicted_s=est.iteration_s, measured_s=r.iteration_s_mean if r.status == "ok" else None,
                           predicted_bytes=peak.allocated,
                           measured_bytes=float(r.peak_memory_bytes) if r.peak_memory_bytes else None,
                           energy_j=r.energy_j_per_iter, energy_source=r.energy_source,
                           footprint_bytes=peak.total, capacity_bytes=float(cluster.devices[0].gpu.memory_bytes),
                           fits="yes" if est.fits else "at risk" if est.within_capacity else "no",
                           expandable_segments=_on_off(s.get("expandable_segments")),
                           reserved_bytes=_peak(raw, "peak_reserved_bytes_per_rank"),
                           device_used_bytes=_peak(raw, "peak_device_used_bytes_per_rank")))
    return out


def figures(data: Path, table: list[Row]) -> dict[str, object]:
    """The figures the CI test holds: time MAPE and Spearman over the ok trials, the micro-batch trend of the
    flash/no-recomputation plan, the worst memory error, what the user script ran."""
    ok = [r for r in table if r.measured_s]
    trend = [r for r in ok if r.plan == "flash_none"]
    user = json.loads((data / "user_script.json").read_text()) if (data / "user_script.json").exists() else {}
    worker_opts = set()
    for path in data.glob("trials_*.jsonl"):
        for line in path.read_text().splitlines():
            if line.strip():
                w = json.loads(line).get("worker") or {}
                if w.get("optimizer"):
                    worker_opts.add(w["optimizer"])
    mem = [abs(r.memory_err_pct) for r in ok if r.memory_err_pct is not None]
    return {
        "trials": len(table), "ok": len(ok),
        "time_mape_pct": mape([r.predicted_s for r in ok], [r.measured_s or 0.0 for r in ok]) if ok else None,
        "time_spearman": spearman([r.predicted_s for r in ok], [r.measured_s or 0.0 for r in ok])[0],
        "mbs_trend_spearman": spearman([r.predicted_s for r in trend], [r.measured_s or 0.0 for r in trend])[0],
        "max_memory_err_pct": max(mem) if mem else None,
        "median_memory_err_pct": statistics.median(mem) if mem else None,
        "optimizers": sorted(worker_opts | ({user["optimizer"]} if user.get("optimizer") else set())),
        "user_attention_kernel": user.get("attention_kernel"),
        "footprint_gib": footprint(table),
    }


def footprint(table: list[Row]) -> list[dict[str, object]]:
    """The whole footprint of every trial that recorded more than its allocated peak (GiB): allocated, reserved,
    device-used, with its expandable-segments setting — the on/off pair side by side."""
    def g(x: float | None) -> float | None:
        return None if x is None else round(x / GiB, 3)

    return [{"plan": r.plan, "mbs": r.mbs, "status": r.status, "expandable_segments": r.expandable_segments,
             "allocated": g(r.measured_bytes), "reserved": g(r.reserved_bytes), "device_used": g(r.device_used_bytes)}
            for r in sorted(table, key=lambda r: (r.plan, r.mbs))
            if r.reserved_bytes is not None or r.device_used_bytes is not None]


def markdown(table: list[Row], figs: dict[str, object]) -> str:
    """The table for docs/gpu_check.md, and the figures under it."""
    def f(x: float | None, spec: str) -> str:
        return "" if x is None else format(x, spec)

    def gib(x: float | None) -> str:
        return f(None if x is None else x / GiB, ".2f")

    lines = ["| plan | mbs | ES | status | kernel ran | pred s | meas s | err % | pred GiB | meas GiB (allocated) "
             "| mem err % | reserved GiB | device GiB | footprint / capacity GiB | fits | J/iter |", "|---" * 16 + "|"]
    for r in sorted(table, key=lambda r: (r.plan, r.mbs)):
        lines.append(f"| {r.plan} | {r.mbs} | {r.expandable_segments} | {r.status} | {r.kernels} | "
                     f"{r.predicted_s:.4g} | {f(r.measured_s, '.4g')} | {f(r.time_err_pct, '+.1f')} | "
                     f"{r.predicted_bytes / GiB:.2f} | {gib(r.measured_bytes)} | {f(r.memory_err_pct, '+.1f')} | "
                     f"{gib(r.reserved_bytes)} | {gib(r.device_used_bytes)} | "
                     f"{r.footprint_bytes / GiB:.2f} / {r.capacity_bytes / GiB:.2f} | {r.fits} | "
                     f"{f(r.energy_j, '.4g')} {r.energy_source or ''} |")
    lines.append("")
    lines += [f"- {k}: {v}" for k, v in figs.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", type=Path)
    p.add_argument("--record", action="store_true", help="write DATA/summary.json (the figures CI holds)")
    args = p.parse_args(argv)
    table = rows(args.data)
    figs = figures(args.data, table)
    print(markdown(table, figs))
    if args.record:
        (args.data / "summary.json").write_text(json.dumps({"figures": figs, "rows": [asdict(r) for r in table]},
                                                           indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
