"""Pipeline schedules: 1F1B exactly as DeepSpeed's TrainSchedule orders it, GPipe, and the DAG built from them."""

from __future__ import annotations

import pytest

from ampe.costmodel.catalog import CATALOG
from ampe.costmodel.schedules import stage_orders
from ampe.energy.inputs import PipelineInputs, dag_from_inputs, inputs_from_estimate
from ampe.energy.pipeline_dag import build_dag
from ampe.tradeoff.dag import TRANSFER
from ampe.tradeoff.options import constant
from tests.support.schedules import gpipe, one_f_one_b


def _short(steps):
    return " ".join(("F" if s.instruction == "forward" else "B") + str(s.microbatch) for s in steps)


def test_1f1b_orders_from_the_perseus_notes():
    expected = {0: "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5", 1: "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5",
                2: "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5", 3: "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5"}
    for s, order in expected.items():
        assert _short(one_f_one_b(4, 6, s)) == order
    assert _short(one_f_one_b(2, 3, 0)) == "F0 F1 B0 F2 B1 B2"
    assert _short(one_f_one_b(2, 3, 1)) == "F0 B0 F1 B1 F2 B2"


def test_1f1b_matches_deepspeed_train_schedule():
    """Oracle: DeepSpeed's own TrainSchedule step → (micro-batch, forward?) mapping."""
    schedule = pytest.importorskip("deepspeed.runtime.pipe.schedule")
    for n in range(1, 9):
        for m in (1, 2, 3, 5, 8, 13):
            for s in range(n):
                ts = schedule.TrainSchedule(micro_batches=m, stages=n, stage_id=s)
                want = []
                for step in range(2 * (m + n - 1)):
                    mb, fwd = ts._step_to_micro_batch(step)
                    if 0 <= mb < m:
                        want.append(("forward" if fwd else "backward", mb))
                got = [(x.instruction, x.microbatch) for x in one_f_one_b(n, m, s)]
                assert got == want
                warmup = next(i for i, x in enumerate(got) if x[0] == "backward")
                assert warmup == min(n - s, m)


def test_gpipe_and_unknown_schedules():
    assert _short(gpipe(3, 3, 1)) == "F0 F1 F2 B0 B1 B2"
    with pytest.raises(ValueError):
        stage_orders("chimera", 2, 2)


def test_dag_edges_transfers_and_topological_order():
    f, b = constant(0.01), constant(0.02)
    dag = build_dag([{"forward": f, "backward": b}] * 3, 4, blocking_w=[10.0] * 3, p2p_forward_s=[0.001, 0.002],
                    p2p_backward_s=[0.003, 0.004])
    assert all(p < v for v, ps in enumerate(dag.preds) for p in ps)
    where = {(n.kind, n.stage, n.microbatch): v for v, n in enumerate(dag.nodes) if n.kind != TRANSFER}
    transfers = [v for v, n in enumerate(dag.nodes) if n.kind == TRANSFER]
    assert len(transfers) == 2 * 2 * 4  # one per boundary, direction and micro-batch
    for v in transfers:
        (p,), succ = dag.preds[v], dag.succs[v]
        assert len(succ) == 1
        a, c = dag.nodes[p], dag.nodes[succ[0]]
        assert a.microbatch == c.microbatch == dag.nodes[v].microbatch and a.kind == c.kind
        assert c.stage == a.stage + (1 if a.kind == "forward" else -1)
        assert dag.options(v).options[0].time_s == [0.001, 0.002, 0.003, 0.004][
            (a.stage if a.kind == "forward" else 2 + c.stage)]
    for mb in range(4):  # the loss edge on the last stage, and schedule order within each stage
        assert where[("forward", 2, mb)] in dag.preds[where[("backward", 2, mb)]]
    for s, order in enumerate(dag.stage_order):
        got = [(dag.nodes[v].kind, dag.nodes[v].microbatch) for v in order]
        assert got == [(x.instruction, x.microbatch) for x in one_f_one_b(3, 4, s)]
        assert all(order[i] in dag.preds[order[i + 1]] for i in range(len(order) - 1))


def test_inputs_adapter_reads_an_estimate_shape():
    class Est:  # the cost model's Estimate: [replica][stage] and [replica][boundary]
        fwd_s = ((0.01, 0.02), (0.03, 0.04))
        bwd_s = ((0.02, 0.04), (0.06, 0.08))
        p2p_s = ((0.001,), (0.002,))

    gpu = CATALOG["A40"]
    inp = inputs_from_estimate(Est(), 1, [gpu, gpu], 4, tp=2)
    assert inp.fwd_s == (0.03, 0.04) and inp.p2p_forward_s == (0.002,) and inp.stage_gpus(0) == 2
    dag = dag_from_inputs(inp)
    first = dag.options(dag.stage_order[0][0])
    assert first.fastest.time_s == pytest.approx(0.03) and len(first.options) == len(gpu.sm_clocks_mhz())
    assert dag.blocking_w == (2 * 70.38, 2 * 70.38)  # tp 2 × Perseus's measured A40 P2P power
    with pytest.raises(ValueError):
        PipelineInputs((0.1,), (0.2, 0.3), (gpu,), 2)
