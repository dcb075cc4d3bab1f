"""The docs' figures re-derived from the code: the tutorial's profile row and column counts (from a real one-tp,
one-mbs profile of the same model) and the model zoo table in docs/reference/model_yaml.md (every zoo name, each
row's layer-entry count)."""

from __future__ import annotations

import csv
import re
import subprocess
import sys

from ampe.costmodel.zoo import load_model, zoo_names
from tests.conftest import ROOT


def _zoo_rows() -> list[tuple[list[str], str]]:
    text = (ROOT / "docs" / "reference" / "model_yaml.md").read_text()
    table = text.split("## Zoo", 1)[1].split("\n\n", 2)[1]  # the table after the heading's blank line
    rows = []
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows.append((re.findall(r"`([^`]+)`", cells[0]), cells[-1]))
    return rows


def test_the_zoo_table_lists_every_zoo_model_with_its_layer_entries():
    rows = _zoo_rows()
    listed = [name for names, _ in rows for name in names]
    assert sorted(listed) == sorted(zoo_names())  # nothing missing, nothing extra, nothing twice
    for names, entries in rows:
        for name in names:
            model = load_model(name)
            blocks = sum(1 for layer in model.layers if layer.kind == "transformer")
            if entries.startswith("L + "):
                assert model.num_layers == blocks + int(entries[4:]), (name, entries)
            else:
                assert model.num_layers == int(entries), (name, entries)


def test_the_tutorials_profile_counts_are_what_the_profiler_writes(tmp_path):
    text = (ROOT / "docs" / "tutorial.md").read_text()
    command = re.search(r"^ampe profile --model (\S+) --device cpu --tp (\S+) --mbs (\S+) ", text, re.M)
    said = re.search(r"and (\d+) columns:\n`([a-z_,]+)` — (\d) tp × (\d) mbs ×\n(\d) modes .*? × (\d+) layers = "
                     r"(\d+) rows", text, re.S)
    assert command and said, "the tutorial's profile step changed shape: update this test"
    model, tps, mbss = command.groups()
    columns, names, n_tp, n_mbs, n_modes, n_layers, n_rows = said.groups()
    assert (int(n_tp), int(n_mbs)) == (len(tps.split(",")), len(mbss.split(",")))
    out = tmp_path / "one.csv"  # one tp, one mbs: the rest multiplies
    subprocess.run([sys.executable, "-m", "ampe", "profile", "--model", model, "--device", "cpu", "--tp", "1",
                    "--mbs", "1", "--warmup", "0", "--repeats", "1", "--out", str(out)], check=True, cwd=tmp_path,
                   capture_output=True, env={"PYTHONPATH": str(ROOT), "DS_ACCELERATOR": "cpu", "PATH": "/usr/bin"})
    with out.open() as f:
        rows = list(csv.DictReader(f))
    header = list(rows[0])
    assert header == names.split(",") and len(header) == int(columns)
    assert len({r["recompute"] for r in rows}) == int(n_modes)
    assert len({r["layer"] for r in rows}) == int(n_layers) == load_model(model).num_layers
    assert len(rows) * int(n_tp) * int(n_mbs) == int(n_rows)
