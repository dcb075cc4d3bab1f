"""Each data-parallel replica's share of the batch at run time (``Strategy.replica_gas``; docs/worker.md, "Uneven
shares"), the torch side: the weighted loss (the weight and the replica's DeepSpeed config are
:func:`ampe.costmodel.training.loss_weight` and :func:`~ampe.costmodel.training.replica_deepspeed_config`, which the
export uses without torch), the samples each replica reads, and the instant each iteration reaches the gradient
reduction (the replica's own time, before it waits for slower replicas)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ampe.costmodel.training import loss_weight

SAMPLE_POOL = 4  # synthetic micro-batches at least, cycled over iterations (a training model memorises them)


def first_microbatch(shares: Sequence[int], replica: int) -> int:
    """Index, within the global batch of Σ shares micro-batches, of replica ``replica``'s first micro-batch (replicas
    read consecutive slices in replica order)."""
    return sum(shares[:replica])


class WeightedLoss:
    """``loss_fn(outputs, labels) × weight``: the pipeline module's loss with the replica's weight."""

    def __init__(self, loss_fn: Callable[..., Any], weight: float) -> None:
        self.loss_fn, self.weight = loss_fn, weight

    def __call__(self, outputs: Any, labels: Any) -> Any:
        return self.loss_fn(outputs, labels) * self.weight


def weighted(loss_fn: Callable[..., Any], shares: Sequence[int], replica: int) -> Callable[..., Any]:
    """``loss_fn`` weighted for replica ``replica`` (:func:`loss_weight`); ``loss_fn`` itself under equal shares, so
    an equal-share run computes exactly what it did before."""
    weight = loss_weight(shares, replica)
    return loss_fn if weight == 1.0 else WeightedLoss(loss_fn, weight)


def replica_batches(vocab: int, seq_len: int, mbs: int, seed: int, shares: Sequence[int],
                    replica: int) -> Iterator[tuple[Any, Any]]:
    """Endless ``(tokens, labels)`` micro-batches of replica ``replica`` (labels = tokens shifted by one): iteration
    i's global batch is micro-batches ``i·G .. i·G + G − 1`` (G = Σ shares) of one synthetic stream, and the replica
    reads its own consecutive slice of it (:func:`first_microbatch`), so over an iteration every micro-batch is read
    once by one replica, whatever the shares. Micro-batch n is the stream's entry ``n mod P`` (P the smallest
    multiple of G ≥ :data:`SAMPLE_POOL`), generated from ``(seed, n mod P)`` alone: nothing is downloaded, every rank
    of a replica reads the same, and a model that trains memorises them, so the loss falls."""
    import torch

    total = sum(shares)
    pool = total * math.ceil(SAMPLE_POOL / total)
    first, own = first_microbatch(shares, replica), shares[replica]
    iteration = 0
    while True:
        for k in range(first, first + own):
            gen = torch.Generator().manual_seed(seed * 1_000_003 + (iteration * total + k) % pool)
            seq = torch.randint(0, vocab, (mbs, seq_len + 1), generator=gen)
            yield seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
        iteration += 1


class ShareSwitch:
    """Timed iterations that alternate between two share vectors in one trial (job ``alternate_shares``: even
    iterations the strategy's ``shares``, odd ones ``other``), so that a shared machine's drift hits both alike, as
    ``alternate_schedule`` does for frequency plans. Before each iteration :meth:`use` sets the engine's micro-batch
    count (``PipelineEngine.set_train_batch_size``: its gas and ``micro_batches``), the loss's weight, and returns
    the replica's data of that vector."""

    def __init__(self, loss: WeightedLoss, mbs: int, replica: int, shares: Sequence[int],
                 other: Sequence[int] | None, data: Callable[[Sequence[int]], Iterator[Any]]) -> None:
        self.loss, self.mbs, self.replica = loss, mbs, replica
        self.vectors = [tuple(shares)] + ([tuple(other)] if other is not None else [])
        self.data = [data(v) for v in self.vectors]

    def use(self, engine: Any, iteration: int) -> Iterator[Any]:
        """Switch ``engine`` to the vector of ``iteration`` (0-based); its data iterator."""
        k = iteration % len(self.vectors)
        shares = self.vectors[k]
        if len(self.vectors) > 1:
            engine.set_train_batch_size(self.mbs * shares[self.replica] * len(shares))
        self.loss.weight = loss_weight(shares, self.replica)
        return self.data[k]


class ReduceMarks:
    """Wraps one engine's ``ReduceGrads`` instruction (its own copy of the instruction map, as
    :class:`~ampe.runtime.hook.FrequencyHook` does) to note when each iteration reaches the gradient reduction, and
    its ``OptimizerStep`` to keep, when asked, the reduced gradients the step used (before clipping)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter, keep_gradients: bool = False) -> None:
        self.clock, self.keep_gradients = clock, keep_gradients
        self.reached_at: float | None = None  # clock() when the last ReduceGrads began
        self.gradients: dict[str, Any] = {}  # parameter name → the last step's reduced gradient (fp32, CPU)

    def install(self, engine: Any) -> None:
        """Wrap ReduceGrads (and OptimizerStep) of this engine instance; call after any other wrapper."""
        from deepspeed.runtime.pipe import schedule

        base = dict(engine._INSTRUCTION_MAP)
        reduce, step = base[schedule.ReduceGrads], base[schedule.OptimizerStep]

        def reduce_grads(eng: Any, **kw: Any) -> Any:
            self.reached_at = self.clock()
            return reduce(eng, **kw)

        def optimizer_step(eng: Any, **kw: Any) -> Any:
            if self.keep_gradients:
                self.gradients = {name: p.grad.detach().float().cpu().clone()
                                  for name, p in eng.module.named_parameters() if p.grad is not None}
            return step(eng, **kw)

        base.update({schedule.ReduceGrads: reduce_grads, schedule.OptimizerStep: optimizer_step})
        engine._INSTRUCTION_MAP = base

    def own_s(self, t0: float) -> float | None:
        """Seconds from ``t0`` (the iteration's start, same clock) until this rank began the gradient reduction."""
        return None if self.reached_at is None or self.reached_at < t0 else self.reached_at - t0
