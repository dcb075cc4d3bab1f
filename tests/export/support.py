"""Shared by the export tests: the MLP model, a two-host CPU cluster, plans searched for them, the fake hosts."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MLP = HERE / "mlp6.yaml"  # the layers of train_mlp.py
USER_SCRIPT = HERE / "train_mlp.py"
FAKE_HOSTS = ROOT / "tests" / "support" / "fake_hosts"
# Two emulated hosts that resolve to this machine's loopback without touching /etc/hosts, at different addresses:
# `localhost` (127.0.0.1) and the literal 127.0.0.2 (all of 127/8 is loopback on Linux). See docs/export.md.
HOSTS = {"n-0": "localhost", "n-1": "127.0.0.2"}
TWO_HOSTS_YAML = """name: two-hosts
latency_us: 50
nodes:
  - {name: n, gpu: cpu, count: 1, intra_gbps: 40, inter_gbps: 10, repeat: 2}
"""


def ampe(*argv: Any) -> tuple[int, str, str]:
    """Run ``ampe`` in-process; (exit code, stdout, stderr). An export that names no ``--script`` gets ``--script
    train.py`` (named explicitly, so not required to exist): without it ampe refuses a missing ``./train.py``, which
    ``tests/export/test_export.py`` tests on its own."""
    from ampe.cli import main

    if argv and argv[0] == "export" and "--script" not in argv:
        argv = (*argv, "--script", "train.py")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def two_host_plan(tmp: Path, model: str | Path = MLP, gbs: int = 8) -> Path:
    """A pp-2 plan for the two-host CPU cluster (searched, with frequency plans), and its host map."""
    tmp.mkdir(parents=True, exist_ok=True)
    spec = tmp / "two-hosts.yaml"
    spec.write_text(TWO_HOSTS_YAML)
    (tmp / "hosts.yaml").write_text("".join(f"{k}: '{v}'\n" for k, v in HOSTS.items()))
    plan = tmp / "plan.json"
    code, _, err = ampe("search", "--cluster", spec, "--model", model, "--global-batch", gbs, "--pp", "2",
                        "--top-k", "4", "--out", plan)
    assert code == 0, err
    return plan


def pick(plan: Path, **want: Any) -> int:
    """The best plan rank whose entry matches ``want`` (``frequency_plan=True`` asks for one with clocks)."""
    for e in json.loads(plan.read_text())["strategies"]:
        if all((bool(e.get(k)) if k == "frequency_plan" else e.get(k) == v) for k, v in want.items()):
            return int(e["rank"])
    raise AssertionError(f"no strategy with {want} in {plan}")


def emulation_available() -> str | None:
    """Why the fake hosts cannot run here (None when they can): they need a UTS namespace."""
    for argv in (["unshare", "--uts", "true"], ["unshare", "--user", "--map-root-user", "--uts", "true"]):
        if shutil.which("unshare") and subprocess.run(argv, capture_output=True).returncode == 0:
            return None
    return "unshare --uts is not permitted here (emulated hosts need their own hostname)"
