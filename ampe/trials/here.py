"""Before any rank starts: can this machine run the trials at all (:func:`check_here`)?

A plan made for a GPU cluster, tried on a laptop, otherwise ends each trial as ``crash`` after the launcher tried to
ssh to hosts that do not exist, or with an ``nvml`` backend on a machine without a GPU. Checked here, without
starting anything and without importing torch:

* every host a trial launches on is this machine (``localhost``, its host name, a loopback address), is named in
  ``--host-map``, or resolves to an address (a real host DeepSpeed's launcher can ssh to);
* GPU trials find at least as many GPUs on this machine as the trial puts ranks on it (``/proc/driver/nvidia``:
  what the NVIDIA driver lists; other hosts' GPUs cannot be seen from here and are not checked);
* the ``nvml`` frequency backend finds a GPU here.

Whatever is missing is said in one line with what to pass instead (:class:`~ampe.errors.InputError`, exit 2).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

from ampe.errors import InputError
from ampe.trials.hostfile import nodes_used
from ampe.trials.launch import choose_launcher
from ampe.trials.prepare import PlannedTrial, RunContext

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # one folder per GPU the driver sees
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
DEFAULT_WORKER = "ampe.runtime.worker"
CPU_HINT = ("to try the strategies on this machine's CPU pass --cluster with a CPU spec of as many devices "
            "and --model gpt2-amp-mini (README, 'Try the demo plan on this machine')")


def gpus_here(root: Path = NVIDIA_GPUS, dev: Path = Path("/dev"), environ: Mapping[str, str] | None = None) -> int:
    """GPUs this process may use: what the NVIDIA driver lists (``/proc/driver/nvidia/gpus``) or, where a container
    hides that, its ``/dev/nvidiaN`` device files, whichever is more; at most as many as ``CUDA_VISIBLE_DEVICES``
    names when it is set. 0 without the driver. (Not tried on a GPU machine: none was at hand.)"""
    environ = os.environ if environ is None else environ
    try:
        listed = sum(1 for _ in root.iterdir())
    except OSError:
        listed = 0
    try:
        files = sum(1 for p in dev.glob("nvidia*") if p.name[6:].isdigit())
    except OSError:
        files = 0
    found = max(listed, files)
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        found = min(found, len([v for v in visible.split(",") if v.strip()]))
    return found


def is_reachable(host: str) -> bool:
    """This machine, or a name that resolves to an address (a host a launcher could ssh to)."""
    if host in LOCAL_NAMES or host == socket.gethostname():
        return True
    try:
        return bool(socket.getaddrinfo(host, None))
    except (OSError, UnicodeError):
        return False


def check_here(ctx: RunContext, trials: Sequence[PlannedTrial], gpus: int | None = None) -> None:
    """Raise :class:`InputError` (one line: what is missing, what to pass) when a trial in ``trials`` cannot start
    here: a host that is neither this machine, nor in ``--host-map``, nor resolvable; GPU ranks on this machine
    without as many GPUs; the ``nvml`` backend without a GPU. ``gpus``: GPUs here (default :func:`gpus_here`)."""
    gpus = gpus_here() if gpus is None else gpus
    spec = ctx.cluster.source or ctx.cluster.name
    host_map = ctx.options.host_map
    for t in trials:
        placement = t.strategy.placement or tuple(range(t.strategy.world_size))
        kind = choose_launcher(ctx.options.launcher, ctx.cluster, placement)
        nodes = nodes_used(ctx.cluster, placement)
        if kind == "deepspeed":
            missing = [n for n in nodes if n not in host_map and not is_reachable(n)]
            if missing:
                raise InputError("--host-map", "", f"{t.trial_id} runs on node(s) {_names(missing)} of {spec}, "
                                 "which are neither this machine nor a host name that resolves here: pass --host-map "
                                 f"HOSTS.yaml (node: hostname), or --launcher torchrun to run every rank here; "
                                 f"{CPU_HINT}")
        if ctx.device == "cuda" and ctx.options.worker == DEFAULT_WORKER:  # another worker may need no GPU
            hosts = [host_map.get(ctx.cluster.devices[d].node, ctx.cluster.devices[d].node) for d in placement]
            here = len(placement) if kind != "deepspeed" else sum(1 for h in hosts if _is_here(h))
            if here > gpus:
                raise InputError("--cluster", "", f"{t.trial_id} puts {here} GPU rank(s) of {spec} on this machine, "
                                 f"which has {gpus} GPU(s): pass --cluster SPEC.yaml of this machine's devices (or "
                                 f"--host-map to run on the plan's hosts); {CPU_HINT}")
    if any(t.backend == "nvml" for t in trials) and gpus == 0:
        raise InputError("--freq-backend", "", "nvml sets GPU clocks, and this machine has no GPU: pass "
                         "--freq-backend emulate (modelled stretch and energy) or none")


def _is_here(host: str) -> bool:
    return host in LOCAL_NAMES or host == socket.gethostname()


def _names(nodes: Sequence[str]) -> str:
    shown = ", ".join(nodes[:4])
    return shown + (f" and {len(nodes) - 4} more" if len(nodes) > 4 else "")
