"""What a planned strategy trains with, as the DeepSpeed config every launcher hands DeepSpeed: the plan's entries,
``ampe trial``'s worker and ``ampe export``'s ``ds_config.json`` all come from :func:`deepspeed_config` (each
data-parallel replica's own, under uneven shares: :func:`replica_deepspeed_config`, with :func:`loss_weight`), and the
memory model (:mod:`ampe.costmodel.memory`) counts this optimizer. The allocator setting the ranks start with
(``PYTORCH_CUDA_ALLOC_CONF``) comes from :func:`allocator_conf`.

The one optimizer is torch's AdamW (``torch.optim.AdamW``, built by DeepSpeed from the config's ``torch_adam``),
fused where torch offers a fused kernel (CUDA, and CPU since torch 2.4): no DeepSpeed op is JIT-built for it, so the
same optimizer runs on every machine (DeepSpeed's own FusedAdam is a CUDA op built on first use, and its build fails
on some toolchains).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ampe.costmodel.memory import ZERO_BUCKET_ELEMS
from ampe.costmodel.strategy import Strategy

#: The optimizer's hyper-parameters (GPT-3's: lr 6e-4, betas 0.9/0.95, weight decay 0.1 → 0.01 for short runs)
LEARNING_RATE = 6e-4
BETAS = (0.9, 0.95)
EPS = 1e-8
WEIGHT_DECAY = 0.01
GRADIENT_CLIPPING = 1.0
OPTIMIZER_NAME = "torch.optim.AdamW"


def optimizer_config(fused: bool = True) -> dict[str, Any]:
    """The config's ``optimizer`` section: torch's AdamW (``torch_adam``), ``fused`` as given."""
    return {"type": "AdamW", "params": {"lr": LEARNING_RATE, "betas": list(BETAS), "eps": EPS,
                                        "weight_decay": WEIGHT_DECAY, "torch_adam": True, "fused": fused}}


def optimizer_label(config: dict[str, Any]) -> str:
    """A record's name for the optimizer a DeepSpeed config asks for, e.g. ``torch.optim.AdamW(fused)``; the
    config's own type for anything else."""
    opt = config.get("optimizer") or {}
    params = opt.get("params") or {}
    if opt.get("type") in ("Adam", "AdamW") and params.get("torch_adam"):
        name = "torch.optim.AdamW" if opt.get("type") == "AdamW" or params.get("adam_w_mode", True) \
            else "torch.optim.Adam"
        return f"{name}(fused)" if params.get("fused") else name
    return str(opt.get("type", "none"))


ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"  # PyTorch's caching-allocator settings, read when CUDA initialises


def allocator_conf(expandable: bool | None, current: str | None = None) -> str | None:
    """The ``PYTORCH_CUDA_ALLOC_CONF`` value a rank of a strategy with ``expandable_segments`` = ``expandable``
    runs with: ``current`` (the environment's) with its ``expandable_segments`` option set as the plan says (the
    other options kept); ``current`` unchanged where the plan sets nothing (None)."""
    if expandable is None:
        return current
    kept = [o.strip() for o in (current or "").split(",")
            if o.strip() and o.split(":")[0].strip() != "expandable_segments"]
    return ",".join([*kept, f"expandable_segments:{expandable}"])


def expandable_in_conf(conf: str | None) -> bool | None:
    """What an allocator settings string (``PYTORCH_CUDA_ALLOC_CONF``'s form, or torch's own read-back) sets
    ``expandable_segments`` to; None where it does not name it (PyTorch's default, off)."""
    for option in (conf or "").split(","):
        key, _, value = option.partition(":")
        if key.strip() == "expandable_segments":
            return value.strip().lower() in ("true", "1")
    return None


def deepspeed_config(s: Strategy, dtype: str, fused: bool = True) -> dict[str, Any]:
    """The DeepSpeed config of ``s`` trained in ``dtype``: pipeline engine batch sizes, the strategy's ZeRO stage,
    :func:`optimizer_config`, gradient clipping, mixed precision as ``dtype`` (fp16/bf16 weights and gradients,
    fp32 master weights and Adam states inside DeepSpeed's optimizer).

    Activation recomputation is not a config key of DeepSpeed's pipeline engine: ``full`` is the
    ``PipelineModule(activation_checkpoint_interval=1)`` argument (transformer blocks as ``checkpointable_layers``)
    and ``selective`` checkpoints core attention inside each block (Megatron's ``--recompute-granularity
    selective``); the config's ``activation_checkpointing`` section sets how ``deepspeed.checkpointing`` keeps the
    checkpoints (on the device, not partitioned)."""
    cfg: dict[str, Any] = {
        # under uneven shares: the config of a replica with the largest share (DeepSpeed checks train_batch_size =
        # mbs·gas·dp against each rank's own config); each replica's own is replica_deepspeed_config
        "train_batch_size": s.gbs if s.replica_gas is None else s.mbs * s.gas * s.dp,
        "train_micro_batch_size_per_gpu": s.mbs,
        "gradient_accumulation_steps": s.gas,
        "gradient_clipping": GRADIENT_CLIPPING,
        "optimizer": optimizer_config(fused),
        "zero_optimization": ({"stage": 1, "reduce_scatter": True, "overlap_comm": False,
                               "reduce_bucket_size": ZERO_BUCKET_ELEMS, "allgather_bucket_size": ZERO_BUCKET_ELEMS}
                              if s.zero else {"stage": 0}),
        "steps_per_print": 10 ** 9,
        "wall_clock_breakdown": False,
    }
    if s.recompute != "none":
        cfg["activation_checkpointing"] = {"partition_activations": False, "cpu_checkpointing": False,
                                           "contiguous_memory_optimization": False,
                                           "number_checkpoints": None, "synchronize_checkpoint_boundary": False,
                                           "profile": False}
    if dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    elif dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def loss_weight(shares: Sequence[int], replica: int) -> float:
    """The factor on replica ``replica``'s loss that makes one DeepSpeed step under uneven ``shares`` (micro-batches
    per replica) the step of equal shares over the same samples: ``g_r·dp/Σg``; 1.0 for equal shares.

    Why: stock DeepSpeed divides a rank's loss by its own ``gradient_accumulation_steps`` before backward
    (``DeepSpeedEngine.backward``, ``scale_wrt_gas``; the pipeline engine's last stage calls it on each micro-batch's
    loss, earlier stages get that scaled gradient back through the pipe), then averages gradients over the dp
    replicas (``allreduce_bucket``: × 1/dp). Replica r with g_r micro-batches so contributes
    ``(1/dp)·(1/g_r)·Σ_its ∇ℓ``, while the step of equal shares over the same G = Σg micro-batches is
    ``(1/G)·Σ_all ∇ℓ``; × ``g_r·dp/G`` makes them equal. DeepSpeed's reported loss (each replica's mean, averaged
    over dp) becomes the mean over all G micro-batches by the same weight."""
    return shares[replica] * len(shares) / sum(shares)


def with_share(cfg: dict[str, Any], mbs: int, share: int, dp: int) -> dict[str, Any]:
    """``cfg`` (a DeepSpeed config, changed in place and returned) with ``share`` gradient accumulation steps and
    the ``train_batch_size`` DeepSpeed's batch check wants with them, ``mbs·share·dp`` (checked in its config and
    again in ``PipelineEngine``; DeepSpeed compares configs across ranks nowhere, so each replica may run its own)."""
    cfg["gradient_accumulation_steps"] = share
    cfg["train_batch_size"] = mbs * share * dp
    return cfg


def replica_deepspeed_config(s: Strategy, replica: int, dtype: str, fused: bool = True) -> dict[str, Any]:
    """The DeepSpeed config replica ``replica``'s ranks start with: :func:`deepspeed_config` with the replica's own
    share (:func:`with_share`); under equal shares the plan's config unchanged."""
    cfg = deepspeed_config(s, dtype, fused)
    return with_share(cfg, s.mbs, s.shares[replica], s.dp) if s.replica_gas is not None else cfg
