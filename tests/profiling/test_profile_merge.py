"""Profiles merged by ampe's own CSV reader and writer (``ampe profile --merge``), on the H200 record's profile:
files with and without energy columns and in any column order merge into one that ``load_profile`` reads as the
original; a conflicting row is one line naming the file and field, exit 2. Identical layers measured once
(``--identical-layers once``) and the CPU's modelled energy (``--modelled-energy``) write honest rows."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from ampe.costmodel.profile import load_profile
from ampe.costmodel.zoo import load_model
from ampe.errors import InputError
from ampe.formats.profile import merge_profile_csvs
from ampe.measure.freq import MODELLED_METER
from ampe.profiling.identical import identical_layers

H200 = Path(__file__).resolve().parents[1] / "data" / "h200" / "gpu_check" / "profile_s4096.csv"


def _table(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def _write(path: Path, rows: list[dict[str, str]], columns: list[str]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, columns, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return path


@pytest.fixture
def split(tmp_path):
    """The H200 profile as its two runs wrote it: eager rows without energy columns (here in reversed column
    order), flash rows with them."""
    rows = _table(H200.read_text())
    columns = list(rows[0])
    assert columns[-2:] == ["forward_j", "backward_j"]
    plain = [c for c in columns if not c.endswith("_j")]
    eager = _write(tmp_path / "eager.csv", [r for r in rows if r["attention"] == "eager"], plain[::-1])
    flash = _write(tmp_path / "flash.csv", [r for r in rows if r["attention"] == "flash"], columns)
    return eager, flash, rows


def test_appending_one_csv_to_another_is_what_broke(split, tmp_path):
    """The H200 run's failure, reproduced: eager's CSV with flash's rows appended (``tail -n +2``)."""
    _, flash, rows = split
    eager = _write(tmp_path / "e.csv", [r for r in rows if r["attention"] == "eager"], list(rows[0])[:11])
    appended = tmp_path / "appended.csv"
    appended.write_text(eager.read_text() + "".join(flash.read_text().splitlines(keepends=True)[1:]))
    with pytest.raises(InputError, match=r"row 122: 13 cells for 11 columns"):
        load_profile(appended)


def test_files_with_and_without_energy_in_any_column_order_merge_into_what_was_measured(split, tmp_path):
    eager, flash, rows = split
    merged = tmp_path / "merged.csv"
    merged.write_text(merge_profile_csvs([eager, flash]))
    got = _table(merged.read_text())
    assert len(got) == len(rows) == 240
    assert list(got[0])[:11] == ["model", "device", "tp", "mbs", "layer", "forward_s", "backward_s", "layer_kind",
                                 "memory_bytes", "attention", "recompute"]
    assert {(r["attention"], r["forward_j"] != "") for r in got} == {("eager", False), ("flash", True)}
    for kernel in ("eager", "flash"):
        m = load_model(str(H200.with_name("s4096.yaml")), kernel)
        want, have = load_profile(H200).for_model(m), load_profile(merged).for_model(m)
        assert have.table == want.table and have.recomputed == want.recomputed


def test_an_identical_row_is_kept_once_and_other_columns_are_carried(split, tmp_path):
    eager, flash, rows = split
    noted = [dict(r, note="rerun") for r in _table(flash.read_text())[:3]]
    again = _write(tmp_path / "again.csv", _table(flash.read_text())[:5], list(_table(flash.read_text())[0]))
    extra = _write(tmp_path / "extra.csv", [dict(r, layer=str(int(r["layer"]) + 100)) for r in noted],
                   [*list(noted[0])])
    got = _table(merge_profile_csvs([eager, flash, again, extra]))
    assert len(got) == len(rows) + 3
    assert [r["note"] for r in got[-3:]] == ["rerun"] * 3 and all(r["note"] == "" for r in got[:-3])


def test_a_conflicting_row_is_one_line_naming_file_row_and_field(split, tmp_path, run_cli):
    eager, flash, _ = split
    flash_rows = _table(flash.read_text())
    changed = [dict(flash_rows[4], forward_s="0.5")]
    other = _write(tmp_path / "other.csv", changed, list(flash_rows[0]))
    code, out, err = run_cli("profile", "--merge", str(eager), str(flash), str(other), "--out",
                             str(tmp_path / "m.csv"))
    assert code == 2 and out == "" and "Traceback" not in err
    assert err == (f"ampe profile: error: {other}: row 2.forward_s: conflicts with {flash} row 6: a second row for "
                   "model llama-3.2-1b-s4096, device H200, tp 1, layer 2, mbs 1, flash attention, recompute none\n")
    assert not (tmp_path / "m.csv").exists()


def test_a_second_row_for_one_slot_within_a_file_is_refused_even_when_equal(split, tmp_path):
    _, flash, _ = split
    rows = _table(flash.read_text())
    twice = _write(tmp_path / "twice.csv", [rows[0], rows[1], rows[0]], list(rows[0]))
    with pytest.raises(InputError, match=r"twice.csv: row 4\.\(row\): conflicts with .*twice.csv row 2"):
        merge_profile_csvs([twice])


def test_a_bad_row_names_its_file(split, tmp_path, run_cli):
    eager, _, _ = split
    bad = tmp_path / "bad.csv"
    bad.write_text("model,device,tp,mbs,layer,forward_s,forward_j\nm,H200,1,1,0,0.1,-3\n")
    code, _, err = run_cli("profile", "--merge", str(eager), str(bad), "--out", str(tmp_path / "m.csv"))
    assert code == 2 and f"{bad}: row 2.forward_j" in err and len(err.strip().splitlines()) == 1


def test_identical_layers_are_the_blocks_and_the_noops():
    assert identical_layers(load_model("llama-3.2-1b")) == {i: 1 for i in range(2, 17)}
    gpt = load_model("gpt2-tiny")
    kinds = [layer.kind for layer in gpt.layers]
    same = identical_layers(gpt)
    assert {kinds[i] for i in same} == {"transformer", "noop"}
    assert all(kinds[j] == kinds[i] and j < i for i, j in same.items())


def test_one_block_measured_with_modelled_energy_writes_honest_rows(tmp_path, run_cli):
    out = tmp_path / "once.csv"
    code, _, err = run_cli("profile", "--model", "llama-tiny", "--attention", "flash", "--recompute", "none,full",
                           "--mbs", "1", "--warmup", "1", "--repeats", "2", "--identical-layers", "once",
                           "--modelled-energy", "--out", str(out))
    assert code == 0, err
    assert "(5 measured, the rest identical)" in err
    rows = _table(out.read_text())
    model = load_model("llama-tiny")
    assert len(rows) == 2 * model.num_layers
    measured = {(r["layer"], r["recompute"]): r for r in rows if r["same_as_layer"] == ""}
    for r in rows:
        assert r["energy_source"] == MODELLED_METER and float(r["forward_j"]) > 0  # a model, labelled so
        if r["same_as_layer"]:
            assert r["same_as_layer"] == "1" and int(r["layer"]) in range(2, 5)
            first = measured[("1", r["recompute"])]
            assert {k: v for k, v in r.items() if k not in ("layer", "same_as_layer")} == \
                {k: v for k, v in first.items() if k not in ("layer", "same_as_layer")}
    assert load_profile(out).covers("llama-tiny", "cpu", 1, model.num_layers)
    code, _, err = run_cli("profile", "--model", "llama-tiny", "--device", "cuda", "--modelled-energy", "--out",
                           str(out))
    assert code == 2 and "--modelled-energy" in err
