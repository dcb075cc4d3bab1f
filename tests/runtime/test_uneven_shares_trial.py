"""Issue 34 item 4: uneven data-parallel shares run for real (torchrun, gloo, fp32, gpt2-tiny, dp 2). Replica r runs
its own number of micro-batches (its own DeepSpeed ``gradient_accumulation_steps``) and its loss is weighted by
``g_r·dp/Σg`` (``ampe.runtime.replicas``), so one optimizer step with shares 6:2 (a 3:1 split) or 5:3 is the step of
equal shares 4:4 over the same 8 micro-batches: the reduced gradient and the parameters after the step agree within
fp32 round-off. Three runs of about 20 s (one shared equal-share run).

The gradient is compared, not only the parameters: Adam's first step is lr·g/(|g| + eps), blind to a gradient's
scale, so a weight off by a common factor would leave the parameters equal. Dropout is off: which replica runs a
micro-batch decides its dropout mask."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ampe.costmodel.training import LEARNING_RATE
from tests.support.worker_runs import run_trial

EQUAL = (4, 4)


def _step(folder: Path, shares: tuple[int, int]) -> tuple[list[dict], dict]:
    folder.mkdir()
    strategy = {"pp": 1, "dp": 2, "tp": 1, "mbs": 1, "gbs": sum(shares)}
    if shares[0] != shares[1]:
        strategy["replica_gas"] = list(shares)
    ranks = run_trial(folder, strategy, warmup_iters=0, timed_iters=1, save_parameters=True, dropout=0.0)
    return ranks, torch.load(folder / "parameters_rank0.pt")


@pytest.fixture(scope="module")
def equal_step(tmp_path_factory):
    return _step(tmp_path_factory.mktemp("shares") / "equal", EQUAL)


@pytest.mark.trial
@pytest.mark.parametrize("uneven", [(6, 2), (5, 3)], ids=["6:2", "5:3"])
def test_uneven_shares_step_equals_the_equal_share_step(tmp_path, equal_step, uneven):
    ranks_eq, eq = equal_step
    ranks_un, un = _step(tmp_path / "uneven", uneven)
    # each replica ran its own share and says so; both report the mean loss over all samples
    assert [r["share"] for r in ranks_un] == list(uneven) and [r["share"] for r in ranks_eq] == list(EQUAL)
    assert ranks_un[0]["loss"] == pytest.approx(ranks_eq[0]["loss"], rel=1e-5)
    assert ranks_un[1]["loss"] == pytest.approx(ranks_un[0]["loss"], rel=1e-6)
    assert all(len(r["own_s"]) == 1 and 0 < r["own_s"][0] <= r["iteration_s"][0] for r in ranks_un)
    assert eq.keys() == un.keys()
    worst_grad = worst_param = 0.0
    for name, want in eq.items():
        g_eq, g_un = want["grad"], un[name]["grad"]
        assert g_eq is not None and g_un is not None, name
        # the reduced gradient: the mean over the same samples, summed in another order
        torch.testing.assert_close(g_un, g_eq, rtol=1e-4, atol=1e-6 * float(g_eq.abs().max()) + 1e-9)
        worst_grad = max(worst_grad, float((g_un - g_eq).abs().max()))
        # Adam's first step amplifies round-off of gradients near eps (see test_llama_tp_trial.py)
        torch.testing.assert_close(un[name]["tensor"], want["tensor"], rtol=0, atol=LEARNING_RATE / 30)
        worst_param = max(worst_param, float((un[name]["tensor"] - want["tensor"]).abs().max()))
    print(f"shares {uneven}: max |Δgrad| {worst_grad:.3g}, max |Δparam| {worst_param:.3g}")
