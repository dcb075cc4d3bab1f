"""Cluster specs for the scale benchmarks: ``n`` GPUs of three types in 8-GPU nodes (issue 16's 64-4,096 GPUs,
issue 28's 1,024 / 4,096 / 16,384 GPUs, and the 1,024-GPU re-plan timing).

The types are H100-80GB, A100-80GB and A100-40GB in (nearly) equal thirds of the nodes, in that order: NVLink inside
a node (2,400 Gbit/s), 400 Gbit/s out of an H100 node and 200 Gbit/s out of the others. A spec of this shape is three
node entries with ``repeat``, whatever ``n``.

Write one as YAML for the CLI::

    python benchmarks/support/scale_specs.py 16384 > /tmp/three-types-16384.yaml
    ampe search --cluster /tmp/three-types-16384.yaml --model llama-3.1-405b --gbs 2048
"""

from __future__ import annotations

import sys
from typing import Any

SCALE_TYPES = ("H100-80GB", "A100-80GB", "A100-40GB")
GPUS_PER_NODE = 8


def three_types(n: int) -> dict[str, Any]:
    """Spec (as parsed YAML) of ``n`` GPUs (a multiple of 8) in 8-GPU nodes of :data:`SCALE_TYPES`, in (nearly)
    equal thirds of the nodes, in that order. Bandwidths in Gbit/s."""
    if n <= 0 or n % GPUS_PER_NODE:
        raise ValueError(f"{n} GPUs: need a positive multiple of {GPUS_PER_NODE}")
    nodes = n // GPUS_PER_NODE
    specs = []
    for i, gpu in enumerate(SCALE_TYPES):
        rep = nodes // 3 + (1 if i < nodes % 3 else 0)
        if rep:
            specs.append({"name": f"n{i}", "gpu": gpu, "count": GPUS_PER_NODE, "intra_gbps": 2400,
                          "inter_gbps": 400 if i == 0 else 200, "repeat": rep})
    return {"name": f"three-types-{n}", "nodes": specs}


def three_types_yaml(n: int) -> str:
    """:func:`three_types` as YAML text (one flow mapping per node entry)."""
    spec = three_types(n)
    lines = [f"name: {spec['name']}", "nodes:"]
    for node in spec["nodes"]:
        lines.append("  - {" + ", ".join(f"{k}: {v}" for k, v in node.items()) + "}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(three_types_yaml(int(sys.argv[1]) if len(sys.argv) > 1 else 1024))
