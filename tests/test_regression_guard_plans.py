"""Regression guard, not an oracle: every bundled cluster spec's plan (strategies, partitions, placements, predicted
times, memory, energy, cost, DeepSpeed configs) is what main 262ead9 made, stored in tests/data/golden_plans.json.
It holds refactors to "no behaviour change". A change that alters plans on purpose regenerates the file (and says
why in its commit)::

    PYTHONPATH=$PWD .venv/bin/python -m tests.support.golden_plans

Floats are compared to 1e-9 relative (a reordered sum may move the last bits; a real change moves far more).
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from tests.support.golden_plans import GOLDEN, IDS, plan_of

REL = 1e-9


def _differences(got: Any, want: Any, where: str = "") -> list[str]:
    """Where ``got`` and ``want`` differ (JSON values; floats to :data:`REL`), at most a few paths."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{where}.{k}: missing" for k in want.keys() - got.keys()]
        out += [f"{where}.{k}: unexpected" for k in got.keys() - want.keys()]
        for k in want.keys() & got.keys():
            out += _differences(got[k], want[k], f"{where}.{k}")
        return out
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{where}: {len(got)} items, golden {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want, strict=True)) for d in _differences(g, w, f"{where}[{i}]")]
    if isinstance(want, float) and isinstance(got, int | float) and not isinstance(got, bool):
        return [] if math.isclose(got, want, rel_tol=REL, abs_tol=1e-12) else [f"{where}: {got!r}, golden {want!r}"]
    return [] if got == want and type(got) is type(want) else [f"{where}: {got!r}, golden {want!r}"]


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())


def test_regression_guard_golden_file_covers_every_case(golden):
    assert sorted(golden) == sorted(IDS)


@pytest.mark.parametrize("case_id", IDS)
def test_regression_guard_bundled_spec_plans_unchanged(case_id, golden):
    differences = _differences(plan_of(case_id), golden[case_id])
    assert not differences, f"{case_id}: {len(differences)} differences, first: {differences[:5]}"
