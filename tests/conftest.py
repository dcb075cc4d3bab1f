"""Shared fixtures: paths to bundled specs and data, and a CLI runner that captures exit code and output."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "cluster_specs"
AMP_PROFILE = ROOT / "ampe" / "data" / "amp_layer_profiles.csv"

os.environ.setdefault("DS_ACCELERATOR", "cpu")
# tables as wide as ampe draws them (200 columns): a header wraps by the width, and a test's temporary paths (longer
# under pytest-xdist's workers) must not decide which
os.environ.setdefault("COLUMNS", "200")

# CI draws the same examples every run (red means a change broke something, never an unlucky draw); a developer's
# run keeps drawing fresh ones, and whatever it finds is kept as an explicit example test.
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture
def run_cli(capsys):
    """Run ``ampe`` in-process; returns (exit_code, stdout, stderr)."""
    from ampe.cli import main

    def _run(*argv: str) -> tuple[int, str, str]:
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:  # argparse
            code = e.code if isinstance(e.code, int) else 1
        out = capsys.readouterr()
        return code, out.out, out.err

    return _run
