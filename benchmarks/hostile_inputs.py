"""Issue 26's hostile inputs, each run as its own ``ampe`` process: wall seconds, peak memory (RSS) and the line it
ends with. Before the readers were bounded: the alias bomb never ended, files under the 64 MiB cap took 50-120 s
and up to 2.6 GB, a 7-million-item plan list 97 s and 11.5 GB, 1.8 million CSV rows 41 s, a 10,000-layer search
a 17.8 GiB MemoryError, a simulated global batch of 2^22 113 s and 2.8 GB.

Run: python benchmarks/hostile_inputs.py   (writes about 250 MB of inputs to a temporary folder)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = "name: c\nnodes:\n- {name: h, gpu: cpu, count: 2, intra_gbps: 40, inter_gbps: 40}\n"
BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))
ROW = "  - [" + ",".join(["0.5"] * 100) + "]\n"


def inputs(tmp: Path) -> dict[str, str]:
    """File name -> text of every input."""
    return {
        "c.yaml": CLUSTER, "s.json": json.dumps({"pp": 2, "dp": 1, "tp": 1, "mbs": 1, "gbs": 4}),
        "bomb.yaml": BOMB,
        "matrix7.yaml": "name: x\nextra:\n" + ROW * (7_000_000 // len(ROW)),
        "matrix16.yaml": "name: x\nextra:\n" + ROW * (16_000_000 // len(ROW)),
        "comment.yaml": "#" + "x" * 60_000_000 + "\n" + CLUSTER,
        "array.json": "[" + ",".join(["0"] * 31_000_000) + "]",
        "plan.json": '{"strategies": [' + ",".join(["12345678"] * 7_000_000) + "]}",
        "rows.csv": "model,device,tp,mbs,layer,forward_s,backward_s\n" + "".join(
            f"gpt2-tiny,cpu,1,{1 + i // 100_000},{i % 100_000},0.001,0.002\n" for i in range(1_800_000)),
        "m10k.yaml": "base: gpt2-tiny\nlayers: 10000\n",
        "gbs.json": json.dumps({"pp": 2, "dp": 1, "tp": 1, "mbs": 1, "gbs": 2**22}),
    }


def cases(t: Path) -> list[tuple[str, list[str]]]:
    """(what, ampe arguments) of every case."""
    ev = ["evaluate", "--model", "gpt2-tiny"]
    return [
        ("alias bomb (342 bytes)", [*ev, "--cluster", str(t / "bomb.yaml"), "--strategy", str(t / "s.json")]),
        ("7 MB YAML matrix", [*ev, "--cluster", str(t / "matrix7.yaml"), "--strategy", str(t / "s.json")]),
        ("16 MB YAML matrix", [*ev, "--cluster", str(t / "matrix16.yaml"), "--strategy", str(t / "s.json")]),
        ("60 MB YAML comment", [*ev, "--cluster", str(t / "comment.yaml"), "--strategy", str(t / "s.json")]),
        ("62 MB JSON array", [*ev, "--cluster", str(t / "c.yaml"), "--strategy", str(t / "array.json")]),
        ("63 MB plan, 7-million-item list", ["trial", "--plan", str(t / "plan.json"), "--dry-run", "--out",
                                             str(t / "runs")]),
        ("52 MB CSV, 1.8 million rows", [*ev, "--cluster", str(t / "c.yaml"), "--profile", str(t / "rows.csv"),
                                         "--strategy", str(t / "s.json")]),
        ("10,000-layer search, 24 GPUs", ["search", "--cluster", str(ROOT / "cluster_specs/mixed-a100-a40.yaml"),
                                          "--model", str(t / "m10k.yaml"), "--global-batch", "64",
                                          "--energy-planner", "none"]),
        ("global batch 2^22, --method simulate", [*ev, "--cluster", str(t / "c.yaml"), "--strategy",
                                                  str(t / "gbs.json"), "--method", "simulate"]),
    ]


def run(argv: list[str]) -> tuple[float, float, int, str]:
    """Wall seconds, peak RSS in MB, exit status and last stderr line of one ampe process (its own rusage)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen([sys.executable, "-m", "ampe", *argv], stdout=subprocess.DEVNULL, stderr=err,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        err.seek(0)
        lines = err.read().strip().splitlines()
    return wall, usage.ru_maxrss / 1024, p.returncode, lines[-1] if lines else ""


def main() -> None:
    if sys.argv[1:2] == ["--write"]:  # in a child: the parent never holds the 250 MB of text
        for name, text in inputs(Path(sys.argv[2])).items():
            (Path(sys.argv[2]) / name).write_text(text)
        return
    with tempfile.TemporaryDirectory() as d:
        t = Path(d)
        subprocess.run([sys.executable, __file__, "--write", d], check=True)
        print(f"{'case':40} {'s':>6} {'peak MB':>8} exit  line")
        for what, argv in cases(t):
            wall, mb, code, line = run(argv)
            print(f"{what:40} {wall:6.2f} {mb:8.0f} {code:4}  {line[:110]}")
    print("load average:", os.getloadavg())


if __name__ == "__main__":
    main()
