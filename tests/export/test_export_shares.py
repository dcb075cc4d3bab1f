"""Issue 34: per-replica shares in the records and the export. An uneven-share plan exports each replica's DeepSpeed
config (its own gas, the train_batch_size DeepSpeed's check wants) and loss weight, which ``ampe.runtime``'s
ExportedPlan hands each rank; trial records, measurement lines and the recorder carry the shares; records and
exports written before read as equal shares."""

from __future__ import annotations

import json

import pytest
from conftest import SPECS

from ampe.errors import InputError
from ampe.formats.measurement import Measurement
from ampe.formats.trial import record_shares, strategy_label
from tests.export.support import ampe


@pytest.fixture(scope="module")
def uneven_plan(tmp_path_factory):
    """A dp-2 plan entry of gpt2-tiny on the 2-core cluster, its shares set to 3:1 micro-batches of 2 samples."""
    tmp = tmp_path_factory.mktemp("shares")
    plan = tmp / "plan.json"
    code, _, err = ampe("search", "--cluster", SPECS / "local-cpu.yaml", "--model", "gpt2-tiny", "--global-batch",
                        "8", "--top-k", "20", "--out", plan)
    assert code == 0, err
    doc = json.loads(plan.read_text())
    entry = next(e for e in doc["strategies"] if e["dp"] == 2 and e["mbs"] == 2)
    entry.update(replica_gas=[3, 1], gas=3, frequency_plan=None)
    plan.write_text(json.dumps(doc))
    return plan, entry["rank"]


def test_an_uneven_export_gives_every_rank_its_replicas_gas_config_and_loss_weight(uneven_plan, tmp_path):
    from ampe.runtime import load_export

    plan, rank = uneven_plan
    out = tmp_path / "exp"
    code, _, err = ampe("export", "--plan", plan, "--rank", rank, "--out", out, "--freq-backend", "none")
    assert code == 0, err
    export = json.loads((out / "export.json").read_text())
    assert export["strategy"]["replica_gas"] == [3, 1]
    for r, (gas, weight) in enumerate([(3, 1.5), (1, 0.5)]):  # gas·dp/Σgas = 3·2/4, 1·2/4
        cfg = json.loads((out / f"ds_config_replica{r}.json").read_text())
        assert (cfg["gradient_accumulation_steps"], cfg["train_batch_size"]) == (gas, 2 * gas * 2)
        for rk in export["ranks"]:
            if rk["replica"] == r:
                p = load_export(out / "export.json", rank=rk["rank"])
                assert (p.shares, p.gas, p.loss_weight) == ((3, 1), gas, weight)
                assert p.deepspeed_config() == cfg
                assert p.measurement_strategy()["replica_gas"] == [3, 1]
                assert p.weighted_loss(lambda o, y: 2.0)(None, None) == 2.0 * weight
    readme = (out / "README.md").read_text()
    assert "## Uneven shares" in readme and "| 1 | 1 | 2 | `ds_config_replica1.json` | 0.5 |" in readme
    assert "plan.weighted_loss(my_loss)" in readme


def test_an_export_without_shares_reads_as_equal_shares(uneven_plan, tmp_path):
    from ampe.runtime import load_export

    plan, rank = uneven_plan
    out = tmp_path / "exp"
    assert ampe("export", "--plan", plan, "--rank", rank, "--out", out, "--freq-backend", "none")[0] == 0
    doc = json.loads((out / "export.json").read_text())
    doc["strategy"].pop("replica_gas")  # as an export written before uneven shares
    doc["strategy"]["gas"] = 2
    (out / "export.json").write_text(json.dumps(doc))
    p = load_export(out / "export.json", rank=1)
    assert (p.shares, p.gas, p.loss_weight) == ((2, 2), 2, 1.0)
    assert p.deepspeed_config() == doc["deepspeed"]
    loss = object()
    assert p.weighted_loss(loss) is loss


def test_records_and_measurement_lines_carry_shares_and_older_ones_read_as_equal():
    old = {"pp": 1, "dp": 2, "tp": 1, "mbs": 2, "gbs": 8, "gas": 2}
    assert record_shares(old) == (2, 2) and strategy_label(old) == "pp1·dp2·tp1·mbs2"
    assert record_shares({k: v for k, v in old.items() if k != "gas"}) == (2, 2)
    new = {**old, "gas": 3, "replica_gas": [3, 1]}
    assert record_shares(new) == (3, 1) and strategy_label(new) == "pp1·dp2·tp1·mbs2·shares3:1"
    line = {"strategy": {**new, "partition": [0, 10]}, "iteration_s": 1.0, "status": "ok"}
    line["strategy"].pop("gas")
    assert Measurement.parse(line, "m.jsonl").strategy.replica_gas == (3, 1)
    line["strategy"].pop("replica_gas")
    assert Measurement.parse(line, "m.jsonl").strategy.replica_gas is None
    for bad in ([3, 2], [4]):  # mbs·Σ ≠ gbs; not one per replica
        line["strategy"]["replica_gas"] = bad
        with pytest.raises(InputError, match="replica_gas"):
            Measurement.parse(line, "m.jsonl")


def test_an_uneven_export_keeps_each_replicas_frequency_plan_of_its_own_length(tmp_path):
    """The energy search on the emulated mix gives replicas of 2 and 4 micro-batches, each its own clock list; the
    export checks each against its replica's share (not the largest) and keeps both."""
    plan = tmp_path / "plan.json"
    code, _, err = ampe("search", "--cluster", SPECS / "local-cpu-mixed.yaml", "--model", "gpt2-tiny",
                        "--global-batch", "6", "--top-k", "2", "--objective", "energy", "--out", plan)
    assert code == 0, err
    entry = next(e for e in json.loads(plan.read_text())["strategies"] if e.get("replica_gas"))
    code, _, err = ampe("export", "--plan", plan, "--rank", entry["rank"], "--out", tmp_path / "exp",
                        "--freq-backend", "emulate")
    assert code == 0, err
    export = json.loads((tmp_path / "exp" / "export.json").read_text())
    fp = export["frequency_plan"]
    per = entry["replica_gas"]
    assert len(set(per)) == 2 and len(fp["replicas"]) == 2
    for r, g in enumerate(per):
        lists = fp["replicas"][(fp.get("replica_plan") or [0, 1])[r]]["stages"]
        assert sorted(mb for i, mb, _ in lists[0] if i == "forward") == list(range(g))
