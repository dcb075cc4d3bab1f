"""Profile CSV: AMP's real measurements load, mbs derivation, bad rows rejected with file and field."""

from __future__ import annotations

import pytest

from ampe.costmodel.profile import load_profile
from ampe.errors import InputError
from tests.conftest import AMP_PROFILE


def test_amp_profile_loads_with_real_values():
    p = load_profile(AMP_PROFILE)
    assert p.models() == {"gpt2-amp", "transgan"}
    assert p.devices("gpt2-amp") == {"T4", "V100-16GB"}
    assert p.tps("gpt2-amp", "T4") == {1, 2, 4}
    assert p.covers("gpt2-amp", "V100-16GB", 1, 30) and not p.covers("gpt2-amp", "V100-16GB", 1, 31)
    assert p.covers("transgan", "V100-16GB", 2, 56)
    fwd, bwd = p.layer_time("gpt2-amp", "T4", 1, 2, 1)
    assert fwd == pytest.approx(0.00490427017) and bwd == pytest.approx(2 * fwd)  # no backward_s column
    # transformer blocks on V100 are faster than on T4 (3.9 vs 5.5 ms in AMP's notes)
    v100 = sum(p.layer_time("gpt2-amp", "V100-16GB", 1, i, 1)[0] for i in range(2, 26)) / 24
    t4 = sum(p.layer_time("gpt2-amp", "T4", 1, i, 1)[0] for i in range(2, 26)) / 24
    assert 0.0035 < v100 < 0.0045 and 0.005 < t4 < 0.006
    assert p.kinds[("gpt2-amp", 28)] == "embed2v"


def test_unprofiled_mbs_interpolates_inside_and_scales_outside(tmp_path):
    csv = tmp_path / "p.csv"
    csv.write_text("model,device,tp,mbs,layer,forward_s,backward_s\n"
                   "m,T4,1,2,0,0.010,0.030\n"
                   "m,T4,1,8,0,0.020,0.050\n")
    p = load_profile(csv)
    assert p.layer_time("m", "T4", 1, 0, 4) == pytest.approx((0.010 + 2 / 6 * 0.010, 0.030 + 2 / 6 * 0.020))
    assert p.layer_time("m", "T4", 1, 0, 1) == pytest.approx((0.005, 0.015))  # per-sample time kept below range
    assert p.layer_time("m", "T4", 1, 0, 16) == pytest.approx((0.040, 0.100))  # and above
    assert p.layer_time("m", "T4", 2, 0, 2) is None


@pytest.mark.parametrize("body,field", [
    ("model,device,tp,mbs,layer\nm,T4,1,1,0\n", "forward_s"),
    ("model,device,tp,mbs,layer,forward_s\nm,Z80,1,1,0,0.1\n", "row 2.device"),
    ("model,device,tp,mbs,layer,forward_s\nm,T4,1,1,0,-0.1\n", "row 2.forward_s"),
    ("model,device,tp,mbs,layer,forward_s\nm,T4,0,1,0,0.1\n", "row 2.tp"),
    ("model,device,tp,mbs,layer,forward_s\nm,T4,1,1.5,0,0.1\n", "row 2.mbs"),
    ("model,device,tp,mbs,layer,forward_s\nm,T4,1,1,0,abc\n", "row 2.forward_s"),
    ("model,device,tp,mbs,layer,forward_s\n", ""),
])
def test_bad_profile_rows(tmp_path, body, field, run_cli):
    csv = tmp_path / "bad.csv"
    csv.write_text(body)
    with pytest.raises(InputError) as e:
        load_profile(csv)
    assert e.value.field == field and str(csv) in str(e.value)
    code, _, err = run_cli("evaluate", "--cluster", "cluster_specs/amp-het-cluster.yaml", "--model", "gpt2-amp",
                           "--profile", csv, "--strategy", "/dev/null")
    assert code == 2 and len(err.strip().splitlines()) == 1 and str(csv) in err


@pytest.mark.parametrize("text, field", [
    # two rows for one (model, device, tp, layer, mbs): which one would win is not a decision to make silently
    ("model,device,tp,mbs,layer,forward_s\ngpt2,A40,1,1,0,0.1\ngpt2,A40,1,1,0,950.6\n", "row 3"),
    # an unquoted extra field would shift the columns
    ("model,device,tp,mbs,layer,forward_s\ngpt2,A40,1,1,0,0.1,0.2\n", "row 2"),
    # a duplicated header: which column is meant?
    ("model,device,tp,mbs,layer,forward_s,forward_s\ngpt2,A40,1,1,0,0.1,0.2\n", "forward_s"),
    ("model,device,tp,mbs,layer,forward_s\ngpt2,A40,1,1,0,nan\n", "row 2.forward_s"),
    ("model,device,tp,mbs,layer,forward_s\ngpt2,A40,true,1,0,0.1\n", "row 2.tp"),
    ("model,device,tp,mbs,layer,forward_s\ngpt2,A40,1,1,0," + "9" * 200_000 + "\n", "line 2"),
])
def test_ambiguous_or_malformed_rows_are_errors(tmp_path, text, field):
    path = tmp_path / "p.csv"
    path.write_text(text)
    with pytest.raises(InputError) as e:
        load_profile(path)
    assert e.value.source == str(path) and e.value.field == field
