"""Issue 36, item 6: ``report`` scores every plan ampe writes against its own spec, plans that leave devices idle
included (``search --devices auto``, a re-plan down to fewer replicas): a measured line that names its devices (a
placement) is predicted on the cluster as given; one that names none still must match the cluster's size."""

from __future__ import annotations

import json

from conftest import SPECS

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.strategy import strategy_from_dict, validate
from ampe.costmodel.zoo import load_model

SPEC = SPECS / "consumer-mixed-1g.yaml"  # 16 devices: two 3090 nodes, two 3080 nodes


def _line(strategy: dict, seconds: float) -> str:
    return json.dumps({"strategy": strategy, "status": "ok", "iteration_s": seconds})


def test_measurements_on_some_of_the_devices_are_scored_on_the_spec(tmp_path, run_cli):
    half = {"pp": 2, "dp": 1, "tp": 4, "mbs": 1, "gbs": 8, "partition": [0, 5, 10], "placement": list(range(8, 16))}
    dp2 = {"pp": 1, "dp": 2, "tp": 2, "mbs": 1, "gbs": 8, "partition": [0, 10], "placement": [0, 1, 4, 5]}
    meas = tmp_path / "m.jsonl"
    meas.write_text(_line(half, 0.02) + "\n" + _line(dp2, 0.03) + "\n")
    code, _, err = run_cli("report", "--measurements", meas, "--cluster", SPEC, "--model", "gpt2-tiny", "--json",
                           tmp_path / "r.json")
    assert code == 0, err
    rows = json.loads((tmp_path / "r.json").read_text())["trials"]
    cm = CostModel(load_cluster(str(SPEC)), load_model("gpt2-tiny"))
    for row, s in zip(rows, (half, dp2), strict=True):
        want = cm.estimate(validate(strategy_from_dict(s, "m"), 16, 10, "m")).iteration_s
        assert row["predicted_s"] == want


def test_a_line_without_placement_on_fewer_devices_is_still_refused(tmp_path, run_cli):
    meas = tmp_path / "m.jsonl"
    meas.write_text(_line({"pp": 2, "dp": 1, "tp": 1, "mbs": 1, "gbs": 8, "partition": [0, 5, 10]}, 0.02) + "\n")
    code, _, err = run_cli("report", "--measurements", meas, "--cluster", SPEC, "--model", "gpt2-tiny")
    assert code == 2 and "give the line's placement" in err, err


def test_a_line_trained_with_frozen_layers_is_predicted_so(tmp_path, run_cli):
    s = {"pp": 2, "dp": 1, "tp": 4, "mbs": 1, "gbs": 8, "partition": [0, 5, 10], "placement": list(range(8))}
    meas = tmp_path / "m.jsonl"
    meas.write_text(_line(s, 0.02) + "\n" + _line({**s, "frozen_layers": 6}, 0.015) + "\n")
    code, _, err = run_cli("report", "--measurements", meas, "--cluster", SPEC, "--model", "gpt2-tiny", "--json",
                           tmp_path / "r.json")
    assert code == 0, err
    rows = json.loads((tmp_path / "r.json").read_text())["trials"]
    assert len(rows) == 2  # not merged: one ran with a frozen prefix
    model = load_model("gpt2-tiny")
    strategy = validate(strategy_from_dict(s, "m"), 16, 10, "m")
    want = sorted(CostModel(load_cluster(str(SPEC)), m).estimate(strategy).iteration_s
                  for m in (model, model.with_frozen_prefix(6)))
    assert sorted(r["predicted_s"] for r in rows) == want and want[0] < want[1]
    meas.write_text(_line({**s, "frozen_layers": 11}, 0.015) + "\n")
    code, _, err = run_cli("report", "--measurements", meas, "--cluster", SPEC, "--model", "gpt2-tiny")
    assert code == 2 and "frozen_layers" in err, err
