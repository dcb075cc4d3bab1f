"""The ranking table of ``ampe search`` reads on a 120-column terminal: one line per strategy, nothing cut with "…",
every stage's GPU type accounted for (runs counted), and the devices and partition in a table of their own."""

from __future__ import annotations

import json
import re

import pytest

from ampe.costmodel.cluster import load_cluster
from ampe.search.placement import compact_summary, stage_labels, summary
from tests.conftest import AMP_PROFILE, SPECS

WIDTH = 120


def _tables(out: str) -> dict[str, list[str]]:
    """Each table's lines (the text printed since the previous table, its title → lines from its top border to its
    bottom border)."""
    tables: dict[str, list[str]] = {}
    title: list[str] = []
    current = None
    for line in out.splitlines():
        if line.startswith("┏"):
            current = tables.setdefault(" ".join(title), [])
            title = []
        if current is not None:
            current.append(line)
            if line.startswith("└"):
                current = None
        elif line.strip():
            title.append(line.strip())
    return tables


def _expand(compact: str) -> list[str]:
    """The per-stage GPU types a compact summary stands for."""
    out: list[str] = []
    for part in compact.replace("\u00a0", " ").split(" | "):
        m = re.fullmatch(r"\(?(.+?)\)? ×(\d+)", part)
        out += [m.group(1)] * int(m.group(2)) if m else [part]
    return out


@pytest.mark.parametrize(("cluster", "model", "extra"), [
    ("amp-het-cluster.yaml", "gpt2-amp", ("--profile", str(AMP_PROFILE), "--global-batch", "32")),  # up to 16 stages
    ("mixed-a100-a40.yaml", "llama-3.1-8b", ()),  # the cluster, with a memory-options column
])
def test_ranking_rows_fit_120_columns_and_name_every_stage(run_cli, monkeypatch, tmp_path, cluster, model, extra):
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    plan = tmp_path / "plan.json"
    code, out, err = run_cli("search", "--cluster", SPECS / cluster, "--model", model, "--top-k", "10", "--out", plan,
                             *extra)
    assert code == 0, err
    entries = json.loads(plan.read_text())["strategies"]
    tables = _tables(out)
    ranking = next(lines for title, lines in tables.items() if "ampe search:" in title)
    rows = [ln for ln in ranking if ln.startswith("│")]
    assert len(rows) == len(entries), "\n".join(ranking)  # one line per strategy: no row wraps
    assert all(len(ln) <= WIDTH for ln in ranking), "\n".join(ranking)
    assert "…" not in out
    spec = load_cluster(SPECS / cluster)
    for row, e in zip(rows, entries, strict=True):
        cells = [c.strip() for c in row.strip("│").split("│")]
        assert cells[0] == str(e["rank"])
        placement = next(c for c in cells if any(g.name in c for g in spec.gpu_types()))
        per_stage = stage_labels(spec, tuple(e["placement"]), e["pp"], e["dp"], e["tp"])
        assert _expand(placement) == [s if "+" in s else s.split("×")[0] for s in per_stage], (placement, per_stage)
    stages = next(lines for title, lines in tables.items() if "stages: device ids" in title)
    stage_rows = [ln for ln in stages if ln.startswith("│")]
    assert len(stage_rows) >= len(entries)  # a long partition may wrap in this table; the ranking does not
    for e in entries:
        assert any(str(e["partition"][1]) in ln for ln in stage_rows)


def test_compact_summary_counts_runs_and_keeps_mixed_stages(tmp_path):
    spec = tmp_path / "c.yaml"
    spec.write_text("name: c\nnodes:\n  - {name: v, gpu: V100-16GB, count: 4, intra_gbps: 100, inter_gbps: 10}\n"
                    "  - {name: t, gpu: T4, count: 4, intra_gbps: 100, inter_gbps: 10}\n")
    c = load_cluster(spec)  # devices 0-3 V100, 4-7 T4
    assert compact_summary(c, tuple(range(8)), 8, 1, 1) == "V100-16GB ×4 | T4 ×4"
    assert compact_summary(c, (4, 5, 0, 1, 2, 3, 6, 7), 4, 2, 1) == "T4 | V100-16GB ×2 | T4"
    assert compact_summary(c, (0, 4, 1, 5, 2, 3, 6, 7), 4, 2, 1) == "(V100-16GB×1+T4×1) ×2 | V100-16GB | T4"
    # the plan keeps every stage, uncut, however many
    assert summary(c, tuple(range(8)), 8, 1, 1) == " | ".join(["V100-16GB×1"] * 4 + ["T4×1"] * 4)
