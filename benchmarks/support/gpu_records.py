"""Every GPU record in tests/data as one shape, and what the cost model predicts for its trials now: time and energy
per iteration with the record's profile, with the profile's energy columns left out, and without a profile.

The records: ``tests/data/h200/gpu_check`` (Llama-3.2-1B at seq 4096, bf16, one H200: ``benchmarks/gpu_check.sh``)
and ``tests/data/h100`` (gpt2-medium, fp16, one H100). Energy is NVML's counter over the timed iterations; the
prediction is the energy planner's at every clock at maximum (no frequency plan ran). Used by
``benchmarks/gpu_records.py`` (the table), ``benchmarks/power_fit.py`` (the fitted power by kernel bound) and
``tests/costmodel/test_gpu_records_time_energy.py`` (the acceptance).
"""

from __future__ import annotations

import csv
import io
import json
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ampe.costmodel.cluster import Cluster, cluster_from_dict, load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.model import Model
from ampe.costmodel.profile import Profile, load_profile
from ampe.costmodel.strategy import Strategy, strategy_from_dict
from ampe.costmodel.zoo import load_model
from ampe.energy.strategy import plan_clocks
from ampe.formats.profile import ENERGY_COLUMNS

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
ONE_H100 = {"name": "one-h100", "nodes": [{"name": "gpu", "gpu": "H100-80GB", "count": 1, "intra_gbps": 3600,
                                           "inter_gbps": 100}]}
PATHS = ("profile", "profile without energy", "no profile")  # how each trial is predicted


@dataclass(frozen=True)
class Trial:
    """One measured trial: how it ran (strategy), seconds and joules per iteration (NVML)."""

    strategy: Strategy
    label: str
    measured_s: float
    measured_j: float


@dataclass(frozen=True)
class Record:
    """One GPU record: its cluster, model, profile CSV and ok trials."""

    name: str
    cluster: Cluster
    model: Model
    profile_path: Path
    trials: tuple[Trial, ...]


@dataclass(frozen=True)
class Prediction:
    """One trial predicted along one path: seconds and joules per iteration."""

    trial: Trial
    path: str
    seconds: float
    joules: float

    @property
    def time_err_pct(self) -> float:
        """(predicted − measured) / measured × 100."""
        return (self.seconds / self.trial.measured_s - 1) * 100

    @property
    def energy_err_pct(self) -> float:
        """(predicted − measured) / measured × 100."""
        return (self.joules / self.trial.measured_j - 1) * 100


def _label(s: dict) -> str:
    return f"{s.get('attention', 'eager')}/{s.get('recompute', 'none')} mbs {s['mbs']}"


@cache
def records() -> tuple[Record, ...]:
    """The GPU records of tests/data (their ok trials with NVML energy)."""
    h200 = DATA / "h200" / "gpu_check"
    lines = [json.loads(x) for f in sorted(h200.glob("trials_*.jsonl")) for x in f.read_text().splitlines() if x]
    latest = {t["key"]: t for t in lines}
    h200_trials = tuple(Trial(strategy_from_dict(t["strategy"], str(h200)), _label(t["strategy"]),
                              t["iteration_s_mean"], t["energy_j_per_iter"])
                        for t in latest.values() if t["status"] == "ok" and t.get("energy_source") == "nvml")
    h100 = DATA / "h100"
    doc = json.loads((h100 / "trials_gpt2m.json").read_text())
    h100_trials = tuple(Trial(strategy_from_dict(t["strategy"], str(h100)), _label(t["strategy"]),
                              t["iteration_s_mean"], t["energy_j_per_iter"])
                        for t in doc["trials"] if t["status"] == "ok" and t.get("energy_source") == "nvml")
    return (Record("H200 Llama-3.2-1B bf16", load_cluster(h200 / "cluster.yaml"), load_model(str(h200 / "s4096.yaml")),
                   h200 / "profile_s4096.csv", h200_trials),
            Record("H100 gpt2-medium fp16", cluster_from_dict(ONE_H100), load_model("gpt2-medium"),
                   h100 / "profile_gpt2m_cuda.csv", h100_trials))


def profile_without_energy(path: Path, devices: list[str]) -> Profile:
    """The profile at ``path`` with its energy columns left out (what a profile taken without NVML holds)."""
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    keep = [c for c in rows[0] if c not in ENERGY_COLUMNS]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=keep, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({c: r[c] for c in keep})
    with tempfile.TemporaryDirectory() as tmp:  # read whole into memory: the file can go
        csv_path = Path(tmp) / path.name
        csv_path.write_text(out.getvalue())
        return load_profile(csv_path, devices)


def predictions(record: Record) -> list[Prediction]:
    """Every trial of ``record`` predicted along each of :data:`PATHS`."""
    devices = [g.name for g in record.cluster.gpu_types()]
    profiles = {"profile": load_profile(record.profile_path, devices),
                "profile without energy": profile_without_energy(record.profile_path, devices), "no profile": None}
    out = []
    for path in PATHS:
        cm = CostModel(record.cluster, record.model, profiles[path])
        for t in record.trials:
            est = cm.estimate(t.strategy)
            point = plan_clocks(est, record.cluster, fastest_only=True).fastest()
            out.append(Prediction(t, path, est.iteration_s, point.energy_max_clock_j))
    return out
