"""What ampe's own runtime can build, and over which tensor-parallel degrees it can shard it (no torch here: the
search, the trial runner and the CLI ask the same questions the runtime's layers answer by running).

The runtime builds two layer lists (:mod:`ampe.runtime.gpt_pipe`, :mod:`ampe.runtime.llama_pipe`) and shards them
Megatron-style (:mod:`ampe.runtime.tensor_parallel`): whole attention heads per rank, the MLP's inner dimension and
the vocabulary split evenly. Grouped-query K/V heads are split when tp divides their number; when there are fewer
K/V heads than ranks and tp is a multiple of their number, each rank holds the one K/V head its query heads use
(replicated over ``tp / kv_heads`` ranks, their gradients summed over those copies).
"""

from __future__ import annotations

from ampe.costmodel.llama import LlamaConfig
from ampe.costmodel.model import Model
from ampe.costmodel.strategy import Strategy

GPT_KINDS_HEAD = ("embedding", "noop")
GPT_KINDS_TAIL = ("noop", "norm", "logits", "noop")


def gpt_layout_problem(model: Model) -> str | None:
    """Why ``model`` is not a GPT-2-family layer list the runtime builds (None: it is)."""
    kinds = tuple(layer.kind for layer in model.layers)
    blocks = len(kinds) - 6
    expected = GPT_KINDS_HEAD + ("transformer",) * blocks + GPT_KINDS_TAIL
    if blocks < 1 or kinds != expected or not (model.hidden and model.heads and model.vocab and model.seq_len):
        return (f"model {model.name!r} is not a GPT-2-family layer list (embedding, noop, blocks, noop, norm, logits, "
                "noop with hidden/heads/vocab/seq_len set); the trial worker builds only those")
    if model.hidden % model.heads:
        return f"model {model.name!r}: hidden {model.hidden} not divisible by heads {model.heads}"
    return None


def llama_layout_problem(model: Model) -> str | None:
    """Why ``model`` is not a Llama-family layer list built from a config that the runtime builds (None: it is)."""
    kinds = tuple(layer.kind for layer in model.layers)
    blocks = len(kinds) - 4
    expected = ("embedding",) + ("transformer",) * blocks + ("norm", "logits", "noop")
    if model.family != "llama" or blocks < 1 or kinds != expected or not isinstance(model.config, LlamaConfig):
        return (f"model {model.name!r} is not a Llama-family layer list built from a config (embedding, blocks, norm, "
                "logits, noop); the trial worker builds only those")
    return None


def build_problem(model: Model) -> str | None:
    """Why the trial worker cannot build ``model`` at all (None: it can), whatever the strategy."""
    return llama_layout_problem(model) if model.family == "llama" else gpt_layout_problem(model)


def kv_heads_per_rank(kv_heads: int, tp: int) -> int:
    """K/V heads one tensor-parallel rank holds: ``kv_heads / tp`` when tp divides them, else 1 (the head its query
    heads use, replicated over ``tp / kv_heads`` ranks). Assumes :func:`tp_problems` found nothing."""
    return kv_heads // tp if kv_heads % tp == 0 else 1


def kv_copies(kv_heads: int, tp: int) -> int:
    """Ranks holding each K/V head: 1 when tp divides ``kv_heads``, else ``tp / kv_heads``."""
    return 1 if kv_heads % tp == 0 else tp // kv_heads


def kv_layout_problem(kv_heads: int, tp: int) -> str | None:
    """Why ``kv_heads`` grouped-query K/V heads cannot be placed on ``tp`` ranks (None: they can)."""
    if kv_heads % tp and tp % kv_heads:
        return (f"tp={tp} neither divides the {kv_heads} K/V heads nor is a multiple of them (each rank must hold "
                "whole K/V heads, or one K/V head shared by all its query heads)")
    return None


def tp_problems(model: Model, tp: int) -> list[str]:
    """Every reason the runtime cannot shard ``model`` over ``tp`` ranks (empty: it can). Assumes the model is
    buildable (:func:`build_problem`)."""
    if tp == 1:
        return []
    need: list[tuple[str, int]] = [("attention heads", model.heads), ("vocabulary", model.vocab)]
    out = []
    if model.family == "llama":
        cfg = model.config
        need.append(("MLP width (ffn)", cfg.ffn))
        kv = kv_layout_problem(cfg.kv_heads, tp)
        if kv:
            out.append(kv)
    else:
        need.append(("hidden size", model.hidden))
    out += [f"tp={tp} does not divide the model's {what} ({n}): the runtime splits it evenly over the ranks"
            for what, n in need if n % tp]
    return sorted(out)


RUNS = "DeepSpeed PipelineEngine TrainSchedule (1F1B) with ampe's own layers"


def schedule_problems(s: Strategy) -> list[str]:
    """Why stock DeepSpeed's pipeline engine cannot run strategy ``s``'s schedule, whatever the layers (empty: it
    can): what an exported plan, whose script may bring its own layers, is held to."""
    if s.schedule == "gpipe":
        return ["stock DeepSpeed's PipelineEngine only runs its 1F1B TrainSchedule; GPipe is planned and costed "
                "but `ampe trial` cannot run it on stock DeepSpeed"]
    if s.schedule != "1f1b":
        return ["interleaved 1F1B (virtual stages) needs Megatron-LM's forward_backward_pipelining_with_interleaving; "
                "stock DeepSpeed has no interleaved schedule"]
    return []


def runtime_problems(s: Strategy, model: Model) -> list[str]:
    """Every reason ampe's trial worker (stock DeepSpeed's pipeline engine with ampe's layers) cannot run strategy
    ``s`` for ``model``; empty when it can. The reasons: a schedule other than DeepSpeed's 1F1B; a model the worker
    does not build (a layer list that is neither the GPT pipe layout nor a Llama-family config); a tensor-parallel
    degree that does not divide the heads, the vocabulary, the hidden size (GPT) or the MLP width (Llama), or that
    neither divides nor is a multiple of the K/V heads (Llama); and at tp > 1 a stage boundary right after the LM
    head (its output, this rank's slice of the logits, is not the replicated activation DeepSpeed's partitioned
    pipe send assumes)."""
    out = schedule_problems(s)
    problem = build_problem(model)
    if problem:
        return [*out, problem]
    out += tp_problems(model, s.tp)
    if s.tp > 1 and s.partition is not None and any(model.layers[c - 1].kind == "logits" for c in s.partition[1:-1]):
        out.append(f"tp={s.tp}: a stage boundary right after the LM head would send its vocabulary slice of the "
                   "logits through DeepSpeed's partitioned pipe send, which assumes the tp ranks hold the same "
                   "activation")
    return out
