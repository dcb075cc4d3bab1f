"""Where a rank runs: which GPU index it selects under the launcher's CUDA_VISIBLE_DEVICES, and whether the host it
landed on is the one the plan names. Plain standard library (no torch), so it is cheap to test."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Mapping


def visible_gpu_index(local_index: int, env: Mapping[str, str] | None = None) -> int:
    """The CUDA index of physical GPU ``local_index`` of this host. DeepSpeed's launcher sets CUDA_VISIBLE_DEVICES to
    the host's included GPUs (``--include host:1,3`` → ``1,3``), which renumbers them from 0; without it (or when the
    list does not name the GPU) the index is the physical one."""
    env = os.environ if env is None else env
    visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return visible.index(str(local_index)) if str(local_index) in visible else local_index


def addresses(host: str) -> set[str]:
    """The IP addresses ``host`` resolves to (empty when it does not resolve)."""
    with contextlib.suppress(OSError, UnicodeError):
        return {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    return set()


def same_host(planned: str, actual: str) -> bool:
    """Whether ``planned`` (a hostfile name or address) names the machine called ``actual`` (its hostname): equal
    names, equal short names (``node1`` vs ``node1.cluster``), or a shared address."""
    if planned == actual:
        return True
    if not (_numeric(planned) or _numeric(actual)) and planned.split(".")[0] == actual.split(".")[0]:
        return True
    return bool(addresses(planned) & addresses(actual))


def _numeric(host: str) -> bool:
    return all(p.isdigit() for p in host.split(".")) or ":" in host
