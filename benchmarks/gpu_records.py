"""Time and energy per iteration on every GPU record in tests/data, predicted now against what was measured.

Each trial three ways: with the record's profile (measured per-layer times and, where it has them, NVML energy per
layer), with the profile's energy columns left out (the power then comes from the kernels' bounds,
docs/energy.md §1), and without a profile (the roofline and the kernels' power alone). The acceptance of issue 32
(tests/costmodel/test_gpu_records_time_energy.py): time MAPE ≤ 3 % with the profile and every run within 10 %
without it; energy within 10 % of NVML along every path.

Run: python benchmarks/gpu_records.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ampe.report.compare import mape
from benchmarks.support.gpu_records import PATHS, predictions, records


def main() -> int:
    short = {"profile": "profile", "profile without energy": "no energy cols", "no profile": "no profile"}
    for record in records():
        preds = predictions(record)
        print(f"\n{record.name}: predicted − measured, % (time, energy per iteration)")
        print(f"  {'trial':22s} {'meas s':>7s} {'meas J':>7s} {'meas W':>6s}"
              + "".join(f" | {short[p]:>15s}" for p in PATHS))
        for t in record.trials:
            cells = []
            for path in PATHS:
                p = next(x for x in preds if x.trial is t and x.path == path)
                cells.append(f"{p.time_err_pct:+6.1f} {p.energy_err_pct:+6.1f}  ")
            print(f"  {t.label:22s} {t.measured_s:7.3f} {t.measured_j:7.1f} {t.measured_j / t.measured_s:6.0f}"
                  + "".join(f" | {c:>15s}" for c in cells))
        for path in PATHS:
            mine = [p for p in preds if p.path == path]
            print(f"  {path}: time MAPE {mape([p.seconds for p in mine], [p.trial.measured_s for p in mine]):.1f} %, "
                  f"worst time {max(abs(p.time_err_pct) for p in mine):.1f} %, "
                  f"worst energy {max(abs(p.energy_err_pct) for p in mine):.1f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
