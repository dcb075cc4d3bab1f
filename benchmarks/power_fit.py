"""The H100/H200 power at f_max by kernel bound (``GpuType.kernel_power``), fitted to the GPU records' NVML energy.

Each measurement is a computation of ``T`` seconds and ``J`` joules at f_max (no clock may be changed on a lent GPU):
every profiled layer with energy columns (forward + backward of one micro-batch) and every trial (one iteration).
The roofline says how long its kernels are bound by tensor-core products, SIMT products and memory traffic
(``ampe.costmodel.kernel_energy``); the fit is non-negative least squares of

    J = P_idle · (T − k·Σ busy) + k · (P_tensor · busy_tensor + P_simt · busy_simt + P_memory · busy_memory)

on relative error, one set of powers for both GH100 cards. Each record's trials together weigh as much as its
profiled layers together (a trial is a whole iteration; a layer one piece of one). A trial's busy seconds are gas ×
its layers' (the backward with recomputation's extra forward work) plus the optimizer step (memory-bound).

Printed: the fit, the error per layer kind and per trial, and each record predicted from a fit to the other alone
(what transfers between the two cards and models). ``tests/costmodel/test_gpu_records_time_energy.py`` refits and
holds the catalog's rounded values to this fit.

Run: python benchmarks/power_fit.py
"""

from __future__ import annotations

import csv
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scipy.optimize import nnls

from ampe.costmodel.compute import busy_seconds
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.kernel_energy import cumulative_busy
from benchmarks.support.gpu_records import Record, records


@dataclass(frozen=True)
class Point:
    """One measured computation: seconds, joules, busy seconds by bound, and what it is."""

    record: str
    kind: str  # "layer" or "trial"
    label: str
    seconds: float
    joules: float
    busy: np.ndarray  # (3,) tensor, simt, memory

    def features(self) -> np.ndarray:
        """[idle s, tensor s, simt s, memory s] of the fit (busy scaled to at most the measured time)."""
        total = float(self.busy.sum())
        k = min(1.0, self.seconds / total) if total > 0 else 0.0
        return np.array([self.seconds - k * total, *(k * self.busy)])


def layer_points(record: Record) -> list[Point]:
    """Every profiled layer with NVML energy (no recomputation rows), with its roofline busy seconds."""
    gpu = record.cluster.gpu_types()[0]
    cache: dict[tuple[str | None, int], tuple[np.ndarray, np.ndarray]] = {}
    out = []
    for r in csv.DictReader(record.profile_path.open()):
        if not r.get("forward_j") or r.get("recompute", "none") not in ("none", ""):
            continue
        att, mbs, i = r.get("attention") or None, int(r["mbs"]), int(r["layer"])
        if (att, mbs) not in cache:
            model = record.model.variant(attention=att)
            cache[(att, mbs)] = busy_seconds(model, gpu, 1, mbs)
        f, b = cache[(att, mbs)]
        out.append(Point(record.name, "layer", f"{att or 'eager'} mbs {mbs} {r['layer_kind']}",
                         float(r["forward_s"]) + float(r["backward_s"]), float(r["forward_j"]) + float(r["backward_j"]),
                         f[i] + b[i]))
    return out


def trial_points(record: Record) -> list[Point]:
    """Every trial: gas × its layers' busy seconds (recomputation included) plus the optimizer step's."""
    gpu = record.cluster.gpu_types()[0]
    cm = CostModel(record.cluster, record.model)
    out = []
    for t in record.trials:
        s = t.strategy
        model = cm.for_strategy(s).model
        fwd, bwd = cumulative_busy(model, gpu, s.tp, s.mbs, s.recompute)
        busy = s.gas * (fwd[-1] + bwd[-1]) + np.array([0.0, 0.0, cm.estimate(s).optimizer_s])
        out.append(Point(record.name, "trial", t.label, t.measured_s, t.measured_j, busy))
    return out


def fit(points: list[Point]) -> np.ndarray:
    """[P_idle, P_tensor, P_simt, P_memory] W: non-negative least squares on relative error, each record's trials
    weighing as much together as its layers together."""
    n = defaultdict(int)
    for p in points:
        n[(p.record, p.kind)] += 1
    w = np.array([1.0 / p.joules * (n[(p.record, "layer")] / n[(p.record, "trial")] if p.kind == "trial" else 1.0)
                  for p in points])
    x = np.array([p.features() for p in points])
    coef, _ = nnls(x * w[:, None], np.array([p.joules for p in points]) * w)
    return coef


def all_points() -> list[Point]:
    """Every layer and trial point of every GPU record."""
    return [p for r in records() for p in (*layer_points(r), *trial_points(r))]


def _errors(points: list[Point], coef: np.ndarray) -> None:
    groups: dict[tuple[str, str, str], list[Point]] = defaultdict(list)
    for p in points:
        groups[(p.record, p.kind, p.label)].append(p)
    for (rec, kind, label), ps in groups.items():
        j = sum(p.joules for p in ps)
        pred = sum(float(p.features() @ coef) for p in ps)
        t = sum(p.seconds for p in ps)
        print(f"  {rec:24s} {kind:5s} {label:34s} measured {j / t:5.0f} W, predicted {pred / t:5.0f} W "
              f"({(pred / j - 1) * 100:+5.1f} %)")


def main() -> int:
    points = all_points()
    coef = fit(points)
    print("power at f_max by kernel bound, H100 and H200 jointly: idle {:.0f} W, tensor {:.0f} W, simt {:.0f} W, "
          "memory {:.0f} W".format(*coef))
    _errors(points, coef)
    names = sorted({p.record for p in points})
    for held in names:
        other = fit([p for p in points if p.record != held])
        print(f"\n{held} predicted from a fit to the other record alone (idle {other[0]:.0f}, tensor {other[1]:.0f}, "
              f"simt {other[2]:.0f}, memory {other[3]:.0f} W):")
        _errors([p for p in points if p.record == held and p.kind == "trial"], other)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
