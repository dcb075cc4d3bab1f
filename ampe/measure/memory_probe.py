"""Memory measurements that mean what the cost model predicts.

* :class:`CpuAllocationTrace` — peak bytes of live torch tensors on CPU over one iteration, the CPU analogue of
  ``torch.cuda.max_memory_allocated``: live tensor bytes at the start (every tensor reachable from Python,
  deduplicated by storage: weights, gradients, optimizer states, pipe buffers) plus the peak of the cumulative
  allocation/free events torch's profiler records (``profile_memory=True``) during the iteration. It counts what
  the cost model counts (weights + grads + optimizer states + activations + buffers + transients), and not the
  process's fixed footprint (interpreter, libraries, gloo/shm buffers, allocator slack) that RSS would add.
* :func:`rss_bytes` / :func:`reset_rss_peak` / :func:`rss_peak_bytes` — the resident set (``/proc/self/status``),
  reported alongside as a cross-check (``VmHWM`` can be reset by writing 5 to ``/proc/self/clear_refs``).
* :class:`SavedActivations` — bytes autograd keeps for backward (``saved_tensors_hooks``), excluding parameters and
  module buffers, deduplicated by storage; the profiler's per-layer ``memory_bytes``.
"""

from __future__ import annotations

import gc
import warnings
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch


def storage_key(t: torch.Tensor) -> tuple[int, int]:
    """(data pointer, bytes) of the storage behind ``t`` (views of one storage share it)."""
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def live_tensors(device_type: str = "cpu") -> list[torch.Tensor]:
    """Every tensor object on ``device_type`` reachable from Python objects (several may share a storage)."""
    out = []
    with warnings.catch_warnings():  # inspecting deprecated module attributes (torch.distributed.reduce_op) warns
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            try:
                if isinstance(obj, torch.Tensor) and obj.device.type == device_type and not obj.is_meta \
                        and storage_key(obj)[0]:
                    out.append(obj)
            except Exception:  # objects that are not safely inspectable (e.g. half-built) are skipped
                continue
    return out


def tensors_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages among ``tensors``."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None and torch.is_tensor(t):
            ptr, n = storage_key(t)
            seen[ptr] = n
    return sum(seen.values())


class CpuAllocationTrace:
    """Context manager: ``peak_bytes`` = live tensor bytes at entry + peak of torch's CPU allocation events inside.

    The profiler does not record the release of a block allocated before it started ("Memory block of unknown size
    was allocated before the profiling started"), so a tensor that is live at entry and freed inside (DeepSpeed's
    last stage keeps each pipe buffer's logits until the slot's next forward) would stay counted to the end. Every
    tensor object live at entry therefore gets a ``weakref.finalize``: when the last Python object of a storage
    dies, the storage's release is added to the timeline (``time.time_ns``, the profiler's clock). A storage also
    held where Python cannot see it (an autograd graph) would be released early by this account; at an iteration
    boundary nothing such should hold a pre-existing tensor."""

    def __init__(self) -> None:
        self.baseline_bytes = 0
        self.peak_delta_bytes = 0
        self.events = 0
        self.released_bytes = 0  # pre-existing storages released inside the traced region
        self._prof: Any = None
        self._refs: dict[int, int] = {}
        self._sizes: dict[int, int] = {}
        self._releases: list[tuple[int, int]] = []
        self._finalizers: list[weakref.finalize] = []

    def _dead(self, ptr: int) -> None:
        import time

        self._refs[ptr] -= 1
        if self._refs[ptr] == 0:
            self._releases.append((time.time_ns(), -self._sizes[ptr]))

    def _watch(self, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            ptr, n = storage_key(t)
            self._refs[ptr] = self._refs.get(ptr, 0) + 1
            self._sizes[ptr] = n
            self._finalizers.append(weakref.finalize(t, self._dead, ptr))

    def __enter__(self) -> CpuAllocationTrace:
        from torch.profiler import ProfilerActivity, profile

        gc.collect()
        self._watch(live_tensors("cpu"))
        self.baseline_bytes = sum(self._sizes.values())
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._prof.__exit__(*exc)
        for f in self._finalizers:  # releases after the region are not part of it
            f.detach()
        self._finalizers = []
        from torch.autograd import DeviceType

        events = [(e.start_ns(), e.nbytes()) for e in self._prof.profiler.kineto_results.events()
                  if e.name() == "[memory]" and e.device_type() == DeviceType.CPU]
        self.released_bytes = -sum(n for _, n in self._releases)
        events += self._releases
        events.sort()
        cur = peak = 0
        for _, n in events:
            cur += n
            peak = max(peak, cur)
        self.peak_delta_bytes, self.events = peak, len(events)
        self._prof = None

    @property
    def peak_bytes(self) -> int:
        """Peak live tensor bytes during the traced region."""
        return self.baseline_bytes + self.peak_delta_bytes


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_bytes() -> int | None:
    """Current resident set size, bytes (Linux), or None."""
    kib = _status_kib("VmRSS")
    return None if kib is None else kib * 1024


def rss_peak_bytes() -> int | None:
    """Resident-set high-water mark since start or the last :func:`reset_rss_peak`, bytes (Linux), or None."""
    kib = _status_kib("VmHWM")
    return None if kib is None else kib * 1024


def reset_rss_peak() -> bool:
    """Reset the RSS high-water mark to the current RSS (Linux ≥ 4.0); False where not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


RSS_PEAK = "rss_peak (the process's resident high-water mark, VmHWM, since the rank started training: host memory)"
CUDA_USED = ("cuda_mem_get_info (the reserved peak plus what the device held beyond PyTorch's reservation at the end: "
             "total - free, device-wide, so another process on the GPU counts too)")


def footprint_peaks(device: str, settings: str | None = None) -> dict[str, Any]:
    """The footprint beside the allocated peak, per rank: the caching allocator's reserved peak
    (``torch.cuda.max_memory_reserved``; None on CPU: no caching allocator), what the process held on the device at
    its peak (``peak_device_used_bytes``, with ``device_used_source`` saying how it was read: on CUDA the reserved
    peak plus what the device holds beyond PyTorch's reservation at the end — the context and libraries, which do
    not change once training runs; on CPU the resident high-water mark) and the allocator settings that ran
    (``allocator_settings``: torch's own read-back where it has one, else ``settings``, the environment's)."""
    if device == "cuda":
        free, total = torch.cuda.mem_get_info()
        reserved_peak = int(torch.cuda.max_memory_reserved())
        outside = (total - free) - int(torch.cuda.memory_reserved())
        read_back = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
        return {"peak_reserved_bytes": reserved_peak, "peak_device_used_bytes": reserved_peak + max(outside, 0),
                "device_used_source": CUDA_USED,
                "allocator_settings": read_back() if read_back is not None else settings}
    return {"peak_reserved_bytes": None, "peak_device_used_bytes": rss_peak_bytes(), "device_used_source": RSS_PEAK,
            "allocator_settings": settings}


class SavedActivations:
    """Context manager counting the bytes autograd saves for backward inside it (peak and at exit), excluding the
    storages of ``exclude`` (parameters, buffers). Storages are counted once however many ops save them."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._excluded = {t.untyped_storage().data_ptr() for t in exclude}
        self._refs: dict[int, int] = {}
        self._sizes: dict[int, int] = {}
        self.live_bytes = 0
        self.peak_bytes = 0
        self._ctx: Any = None

    def _release(self, ptr: int) -> None:
        self._refs[ptr] -= 1
        if self._refs[ptr] == 0:
            del self._refs[ptr]
            self.live_bytes -= self._sizes.pop(ptr)

    def _pack(self, t: torch.Tensor) -> Any:
        ptr, n = storage_key(t)
        if ptr in self._excluded or not ptr:
            return t
        if ptr not in self._refs:
            self._refs[ptr], self._sizes[ptr] = 0, n
            self.live_bytes += n
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self._refs[ptr] += 1
        holder = _Saved(t)
        weakref.finalize(holder, self._release, ptr)
        return holder

    @staticmethod
    def _unpack(packed: Any) -> torch.Tensor:
        return packed.tensor if isinstance(packed, _Saved) else packed

    def __enter__(self) -> SavedActivations:
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ctx.__exit__(*exc)


class _Saved:
    """A saved tensor whose lifetime tracks the autograd node that holds it."""

    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
