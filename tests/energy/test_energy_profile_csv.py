"""Perseus/Zeus instruction profiles: read as they are, 3D rank columns combined, bad files rejected in one line."""

from __future__ import annotations

import pytest

from ampe.energy.profile_csv import load_instruction_profile
from ampe.errors import InputError

GOOD = """stage,instruction,frequency,time,energy
0,forward,1410,0.010,3.0
0,forward,1200,0.012,2.6
0,backward,1410,0.020,6.0
0,backward,1200,0.024,5.3
1,forward,1410,0.011,3.3
1,backward,1410,0.022,6.5
1,backward,1005,0.030,6.1
"""


def test_reads_the_zeus_format(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text(GOOD)
    prof = load_instruction_profile(path, 2)
    assert prof.num_stages == 2 and prof.gpus_per_stage == (1, 1)
    fwd0 = prof.specs[(0, "forward")].options
    assert [(o.mhz, o.time_s, o.energy_j) for o in fwd0] == [(1200, 0.012, 2.6), (1410, 0.010, 3.0)]
    assert len(prof.specs[(1, "forward")].options) == 1  # one clock: a constant-time computation
    assert load_instruction_profile(path).num_stages == 2  # stages inferred


def test_rank_columns_combine_like_zeus_make_3d_parallel(tmp_path):
    """Two tensor-parallel ranks per stage: time = max over ranks, energy = sum, two GPUs; clocks measured on
    only one rank are dropped."""
    rows = ["stage,instruction,frequency,time,energy,rank,dp_rank,pp_rank,tp_rank"]
    for s in range(2):
        for r in range(2):
            rank = 2 * s + r
            for kind, t in (("forward", 0.01), ("backward", 0.02)):
                rows.append(f"{s},{kind},1410,{t + 0.001 * r},{3.0 + r},{rank},0,{s},{r}")
                rows.append(f"{s},{kind},1200,{1.2 * t + 0.001 * r},{2.5 + r},{rank},0,{s},{r}")
    rows.append("0,forward,900,0.02,2.0,0,0,0,0")  # only rank 0 has this clock
    path = tmp_path / "p3d.csv"
    path.write_text("\n".join(rows) + "\n")
    prof = load_instruction_profile(path, 2)
    assert prof.gpus_per_stage == (2, 2)
    opts = prof.specs[(0, "forward")].options
    assert [o.mhz for o in opts] == [1200, 1410]
    assert opts[1].time_s == pytest.approx(0.011) and opts[1].energy_j == pytest.approx(7.0)


@pytest.mark.parametrize("body,stages,field", [
    ("stage,instruction,frequency,time\n0,forward,1410,0.01\n", 1, "energy"),
    ("stage,instruction,frequency,time,energy\n", 1, "(rows)"),
    ("stage,instruction,frequency,time,energy\n0,forward,1410,0.01,3\n", 1, "instruction"),
    ("stage,instruction,frequency,time,energy\n0,forward,1410,0.01,3\n0,backward,1410,0.02,6\n", 2, "stage"),
    ("stage,instruction,frequency,time,energy\n0,forward,1410,-0.01,3\n", 1, "row 2.time"),
    ("stage,instruction,frequency,time,energy\n0,forward,1410,abc,3\n", 1, "row 2.time"),
    ("stage,instruction,frequency,time,energy\n0,forward,1410,nan,3\n", 1, "row 2.time"),
    ("stage,instruction,frequency,time,energy\n0,forward,fast,0.01,3\n", 1, "row 2.frequency"),
    ("stage,instruction,frequency,time,energy\n0,forward,0,0.01,3\n", 1, "row 2.frequency"),
    ("stage,instruction,frequency,time,energy\n0,forward,1410,0.01,-3\n", 1, "row 2.energy"),
    ("stage,instruction,frequency,time,energy\n-1,forward,1410,0.01,3\n", 1, "row 2.stage"),
    ("stage,instruction,frequency,time,energy\n0.5,forward,1410,0.01,3\n", 1, "row 2.stage"),
    ("stage,instruction,frequency,time,energy\n0,recompute,1410,0.01,3\n", 1, "row 2.instruction"),
    ("stage,instruction,frequency,time,energy\n0,forward,1410,0.01\n", 1, "row 2"),
    ("stage,instruction,frequency,time,energy\n0,forward,1410,0.01,3\n0,forward,1410,0.01,3\n", 1, "row 3"),
    ("stage,instruction,frequency,time,energy\n3,forward,1410,0.01,3\n3,backward,1410,0.02,6\n", 2, "stage"),
    # ambiguity is an error, never a silent choice: which "time" column is meant, an unquoted extra field (every
    # later column would shift), a field above the csv module's size limit (was a traceback)
    ("stage,instruction,frequency,time,energy,time\n0,forward,1410,0.01,3,0.02\n", 1, "time"),
    ("stage,instruction,frequency,time,energy\n0,forward,1410,0,01,3\n", 1, "row 2"),
    ("stage,instruction,frequency,time,energy\n0,forward,1410,0.01," + "9" * 200_000 + "\n", 1, "line 2"),
])
def test_bad_profiles_name_file_and_field(tmp_path, run_cli, body, stages, field):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(InputError) as e:
        load_instruction_profile(path, stages)
    assert e.value.field == field and e.value.source == str(path)
    code, out, err = run_cli("frontier", "--profile", path, "--stages", stages, "--microbatches", 2,
                             "--out", tmp_path / "f.json")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and str(path) in err and field in err


def test_missing_file_is_one_line(tmp_path, run_cli):
    code, _, err = run_cli("frontier", "--profile", tmp_path / "nope.csv", "--stages", 1, "--microbatches", 1,
                           "--out", tmp_path / "f.json")
    assert code == 2 and "nope.csv" in err and len(err.strip().splitlines()) == 1
