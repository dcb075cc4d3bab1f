"""Slow and shared links (issue 32 item 5): the search's estimate (``--method eq5``) against the schedule simulation
(``--method simulate``), now and before, on a ~1 Gbit/s mixed consumer-GPU cluster and on AMP's het-cluster.

* **consumer-mixed-1g** (``cluster_specs/consumer-mixed-1g.yaml``: 2 nodes of 4 × RTX 3090, 2 of 4 × RTX 3080,
  PCIe inside, one 1 Gbit/s NIC per node), GPT-2 medium in fp16, global batch 64, uniform partitions in Megatron
  order: representative degrees (one stage per node with tensor parallelism inside it, several stages per node,
  data-parallel replicas sharing a node's NIC).
* **amp-het-cluster** (10 Gbit/s between the V100 nodes), AMP's GPT-2 with AMP's measured per-layer profile: the
  strategies whose iteration time AMP measured (Tables 8-9; ``tests/costmodel/test_fidelity_amp_measurements.py``),
  with the measurement.

Columns: ``eq5`` and ``simulate`` are this tree's iteration seconds; ``before`` columns are another checkout's
(``--before DIR``, e.g. ``/work/main``: this script runs itself there with ``--json``), ``gap`` is
(eq5 − simulate) / simulate, ``own NICs`` eq5 with one network interface per GPU (``nics: 4``: no sharing, the
blocking transfers alone), ``meas`` AMP's measurement. Nothing here is timed: the figures are the cost model's.

Run: PYTHONPATH=$PWD .venv/bin/python benchmarks/slow_links.py [--before /path/to/other/checkout]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "cluster_specs"
PROFILE = ROOT / "ampe" / "data" / "amp_layer_profiles.csv"

# (pp, dp, tp, mbs) on the consumer cluster, global batch 64, uniform partition, Megatron order
CONSUMER = [(4, 1, 4, 1), (4, 1, 4, 4), (8, 1, 2, 1), (8, 2, 1, 1), (16, 1, 1, 1), (4, 4, 1, 1), (4, 2, 2, 2),
            (2, 2, 4, 2)]
# (pp, dp, tp, mbs, partition, measured s) on AMP's het-cluster, global batch 32 (AMP Tables 8-9)
P16 = (0, 3, 5, 7, 9, 11, 13, 15, 16, 17, 19, 20, 21, 22, 23, 25, 30)
AMP_HET = [(2, 8, 1, 2, (0, 14, 30), 2.27), (2, 8, 1, 4, (0, 14, 30), 2.32), (4, 4, 1, 8, (0, 8, 14, 20, 30), 1.97),
           (2, 4, 2, 8, (0, 14, 30), 2.43), (4, 2, 2, 16, (0, 8, 14, 20, 30), 2.34),
           (4, 4, 1, 1, (0, 7, 14, 20, 30), 1.47), (8, 2, 1, 1, (0, 5, 9, 12, 15, 18, 21, 24, 30), 1.28),
           (16, 1, 1, 1, P16, 1.52), (4, 4, 1, 2, (0, 8, 14, 20, 30), 1.52),
           (8, 2, 1, 2, (0, 5, 9, 12, 14, 17, 20, 23, 30), 1.54)]


def figures() -> list[dict]:
    """eq5 and simulate iteration seconds of every case, with this tree's ampe (whatever ``import ampe`` finds)."""
    from ampe.costmodel.cluster import cluster_from_dict, load_cluster
    from ampe.costmodel.estimate import CostModel
    from ampe.costmodel.profile import load_profile
    from ampe.costmodel.strategy import Strategy
    from ampe.costmodel.zoo import load_model
    from ampe.errors import InputError
    from ampe.io import read_yaml

    out = []
    cm = CostModel(load_cluster(SPECS / "consumer-mixed-1g.yaml"), load_model("gpt2-medium"))
    raw = read_yaml(SPECS / "consumer-mixed-1g.yaml")
    own = None
    with contextlib.suppress(InputError):  # one NIC per GPU (a tree without ``nics`` refuses the key)
        own = CostModel(cluster_from_dict({**raw, "nodes": [{**n, "nics": n["count"]} for n in raw["nodes"]]}),
                        cm.model)
    cases: list[tuple] = [("consumer-mixed-1g", cm, Strategy(pp, dp, tp, mbs, 64), None)
                          for pp, dp, tp, mbs in CONSUMER]
    cm = CostModel(load_cluster(SPECS / "amp-het-cluster.yaml"), load_model("gpt2-amp"), load_profile(PROFILE))
    cases += [("amp-het-cluster", cm, Strategy(pp, dp, tp, mbs, 32, part), meas)
              for pp, dp, tp, mbs, part, meas in AMP_HET]
    for spec, model, s, meas in cases:
        eq5, sim = model.estimate(s), model.estimate(s, "simulate")
        alone = own.estimate(s).iteration_s if own is not None and spec == "consumer-mixed-1g" else None
        out.append({"spec": spec, "strategy": f"pp{s.pp} dp{s.dp} tp{s.tp} mbs{s.mbs}", "eq5": eq5.iteration_s,
                    "simulate": sim.iteration_s, "own_nics": alone, "measured": meas})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", metavar="DIR", help="another ampe checkout to take the 'before' columns from")
    p.add_argument("--json", action="store_true", help="print the figures as JSON (what --before reads)")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    now = figures()
    if args.json:
        print(json.dumps(now))
        return
    before: list[dict | None] = [None] * len(now)
    if args.before:
        # this script in this tree, but importing ampe from the other checkout first
        code = (f"import sys; sys.path.insert(0, {str(Path(args.before).resolve())!r}); "
                f"sys.argv = ['slow_links', '--json']; sys.path.insert(1, {str(ROOT)!r}); "
                "from benchmarks.slow_links import figures; import json; print(json.dumps(figures()))")
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        before = json.loads(run.stdout.strip().splitlines()[-1])
    print(f"{'cluster':18} {'strategy':20} {'before eq5':>10} {'before sim':>10} {'eq5':>8} {'simulate':>8} "
          f"{'gap':>7} {'own NICs':>8} {'meas':>6}")
    for f, b in zip(now, before, strict=True):
        old = f"{b['eq5']:10.3f} {b['simulate']:10.3f}" if b else f"{'-':>10} {'-':>10}"
        meas = f"{f['measured']:6.2f}" if f["measured"] else f"{'':6}"
        alone = f"{f['own_nics']:8.3f}" if f.get("own_nics") else f"{'':8}"
        gap = (f["eq5"] - f["simulate"]) / f["simulate"]
        print(f"{f['spec']:18} {f['strategy']:20} {old} {f['eq5']:8.3f} {f['simulate']:8.3f} {gap:+7.1%} {alone} "
              f"{meas}")
    for spec in dict.fromkeys(f["spec"] for f in now):
        rows = [(f, b) for f, b in zip(now, before, strict=True) if f["spec"] == spec]
        gaps = [abs(f["eq5"] - f["simulate"]) / f["simulate"] for f, _ in rows]
        line = f"{spec}: eq5 vs simulate, largest |gap| {max(gaps):.1%}"
        if all(b for _, b in rows):
            old = [abs(b["eq5"] - b["simulate"]) / b["simulate"] for _, b in rows if b]
            line += f" (before {max(old):.1%})"
        measured = [(f, b) for f, b in rows if f["measured"]]
        if measured:
            mape = sum(abs(f["eq5"] - f["measured"]) / f["measured"] for f, _ in measured) / len(measured)
            line += f"; eq5 MAPE against AMP's measurements {mape:.1%}"
            if all(b for _, b in measured):
                old_mape = sum(abs(b["eq5"] - b["measured"]) / b["measured"] for _, b in measured if b)
                line += f" (before {old_mape / len(measured):.1%})"
        print(line)


if __name__ == "__main__":
    main()
