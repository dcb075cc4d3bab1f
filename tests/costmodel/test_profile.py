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


# --- attention kernels and recomputation rows ---------------------------------------------------------------------
HEADER = "model,device,tp,mbs,layer,forward_s,backward_s,layer_kind,memory_bytes,attention,recompute\n"


def _llama_tiny_csv(path, extra: str = "") -> None:
    """llama-tiny (8 layers; blocks 1-4) on cpu: every layer with eager attention at 1 ms / 2 ms / 1000 B, block 1
    also under full (1.1 ms / 3.5 ms / 10 B) and selective recomputation, every layer with flash at 0.5 ms."""
    rows = [f"llama-tiny,cpu,1,1,{i},0.001,0.002,,1000,eager,none" for i in range(8)]
    rows += ["llama-tiny,cpu,1,1,1,0.0011,0.0035,transformer,10,eager,full",
             "llama-tiny,cpu,1,1,1,0.0012,0.0025,transformer,600,eager,selective"]
    rows += [f"llama-tiny,cpu,1,1,{i},0.0005,0.001,,500,flash,none" for i in range(8)]
    path.write_text(HEADER + "\n".join(rows) + "\n" + extra)


def test_rows_are_read_for_the_models_attention_kernel(tmp_path):
    from ampe.costmodel.zoo import load_model

    csv = tmp_path / "p.csv"
    _llama_tiny_csv(csv)
    raw = load_profile(csv)
    assert raw.kernels("llama-tiny") == {"eager", "flash"}
    eager = raw.for_model(load_model("llama-tiny"))  # fp32: eager by default
    flash = raw.for_model(load_model("llama-tiny", "flash"))
    assert eager.attention == "eager" and flash.attention == "flash"
    assert eager.layer_time("llama-tiny", "cpu", 1, 3, 1) == pytest.approx((0.001, 0.002))
    assert flash.layer_time("llama-tiny", "cpu", 1, 3, 1) == pytest.approx((0.0005, 0.001))
    assert flash.layer_memory("llama-tiny", "cpu", 1, 3, 1) == 500
    # recomputation rows of the view's kernel only; unmeasured modes and layers are None
    full = eager.recompute_sample("llama-tiny", "cpu", 1, 1, 2, "full")
    assert (full.forward_s, full.backward_s, full.memory_bytes) == pytest.approx((0.0022, 0.007, 20))  # ∝ mbs
    assert eager.recompute_sample("llama-tiny", "cpu", 1, 2, 1, "full") is None
    assert flash.recompute_sample("llama-tiny", "cpu", 1, 1, 1, "full") is None
    assert eager.recompute_sample("llama-tiny", "cpu", 1, 3, 1, "none") == eager.layer_sample("llama-tiny", "cpu", 1,
                                                                                                3, 1)
    assert raw.for_model(load_model("llama-tiny")) is eager  # cached
    assert eager.for_model(load_model("llama-tiny", "flash")) is flash  # a view re-selects from every row


def test_an_empty_attention_column_is_the_models_default_kernel(tmp_path):
    from ampe.costmodel.zoo import load_model

    csv = tmp_path / "p.csv"
    csv.write_text("model,device,tp,mbs,layer,forward_s\n" + "".join(f"gpt2-tiny,cpu,1,1,{i},0.001\n"
                                                                       for i in range(10)))
    p = load_profile(csv)
    assert p.kernels("gpt2-tiny") == {None}
    assert p.for_model(load_model("gpt2-tiny")).covers("gpt2-tiny", "cpu", 1, 10)  # GPT: eager by default
    assert not p.for_model(load_model("gpt2-tiny", "flash")).table  # not the flash kernel's rows
    line, warning = p.describe(load_model("gpt2-tiny", "flash"))
    assert line.startswith("profile: no rows of gpt2-tiny with flash attention")
    assert "eager (no attention column) attention are not used" in warning
    # a 16-bit Llama model defaults to flash: its empty-column rows are flash rows
    csv.write_text("model,device,tp,mbs,layer,forward_s\n" + "".join(f"llama-3.2-1b,A100-80GB,1,1,{i},0.001\n"
                                                                       for i in range(20)))
    p = load_profile(csv)
    assert p.for_model(load_model("llama-3.2-1b")).covers("llama-3.2-1b", "A100-80GB", 1, 20)
    assert not p.for_model(load_model("llama-3.2-1b", "eager")).table


def test_measured_recompute_rows_replace_the_analytic_terms(tmp_path):
    from ampe.costmodel.cluster import load_cluster
    from ampe.costmodel.compute import recompute_extra_s
    from ampe.costmodel.estimate import CostModel
    from ampe.costmodel.zoo import load_model
    from tests.conftest import ROOT

    csv = tmp_path / "p.csv"
    _llama_tiny_csv(csv)
    model = load_model("llama-tiny")
    cm = CostModel(load_cluster(ROOT / "tests/data/cpu_trials_quiet/local-cpu.yaml"), model, load_profile(csv))
    cpu = cm.cluster.devices[0].gpu
    base = cm.layer_times(cpu, 1, 1)
    assert base.source == "profile" and base.forward_s == pytest.approx([0.001] * 8)
    full = cm.layer_times(cpu, 1, 1, recompute="full")
    analytic = recompute_extra_s(model, base.forward_s, "full")
    assert (full.forward_s[1], full.backward_s[1]) == pytest.approx((0.0011, 0.0035))  # measured
    assert full.backward_s[2:5] == pytest.approx(0.002 + analytic[2:5])  # blocks 2-4: not measured under full
    assert full.backward_s[[0, 5, 6, 7]] == pytest.approx([0.002] * 4)  # nothing recomputed there
    sel = cm.layer_times(cpu, 1, 1, recompute="selective")
    assert sel.backward_s[1] == pytest.approx(0.0025)
    # memory: the measured row under the mode, else the plain measurement scaled by the analytic ratio
    acts = cm.layer_activations(cpu, 1, 1, "full")
    block = model.layers[2]
    assert acts[1] == 10
    assert acts[2] == pytest.approx(1000 * block.act_bytes(1, cpu.mask_bytes(4), "full")
                                    / block.act_bytes(1, cpu.mask_bytes(4)))
    assert cm.layer_activations(cpu, 1, 1, "selective")[1] == 600
    line, warning = load_profile(csv).describe(model)
    assert line == ("profile: 8 layers of llama-tiny on cpu (tp 1, mbs 1), eager attention, recompute none measured "
                    "(selective/full analytic) (flash attention rows left out)")  # full rows for one block only
    assert warning is None  # the eager rows are there: the flash ones are only named
    # the flash sibling (a record that ran flash) reads the flash rows
    from ampe.costmodel.strategy import Strategy

    sib = cm.for_strategy(Strategy(pp=1, dp=1, tp=1, mbs=1, gbs=1, attention="flash"))
    assert sib is not cm and sib.layer_times(cpu, 1, 1).forward_s == pytest.approx([0.0005] * 8)


@pytest.mark.parametrize("extra, field, fragment", [
    ("llama-tiny,cpu,1,1,1,0.3,0.4,,,eager,full\n", "row 20", "recompute full"),
    ("llama-tiny,cpu,1,1,1,0.3,0.4,,,sdpa,none\n", "row 20.attention", "eager"),
    ("llama-tiny,cpu,1,1,1,0.3,0.4,,,eager,partial\n", "row 20.recompute", "selective"),
])
def test_bad_or_repeated_attention_and_recompute_rows(tmp_path, extra, field, fragment):
    csv = tmp_path / "p.csv"
    _llama_tiny_csv(csv, extra)
    with pytest.raises(InputError) as e:
        load_profile(csv)
    assert e.value.field == field and fragment in e.value.message
