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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files with trial tests (real DeepSpeed processes, the slowest by far) run first, each file kept whole and in
    its own order: `make test` hands files to two xdist workers as they free up, and trial files collected last
    (tests/trials/ sorts late) left one worker running them alone at the end."""
    trial_files = {item.path for item in items if item.get_closest_marker("trial") is not None}
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (item.path not in trial_files, order[id(item)]))


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
