"""A trial's ``result.json`` from every rank's report (rank 0 gathers them): the slowest rank's time per iteration,
energy summed over ranks, each replica's share and own time, the host's other busy cores."""

from __future__ import annotations

import math
from typing import Any

from ampe.formats.job import JobFile

MODELLED = "modelled (no energy counter on this machine)"


def _mean_std(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))



def aggregate(job: JobFile, ranks: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """``result.json`` from every rank's report: per-iteration time is the slowest rank's."""
    n = min(len(r["iteration_s"]) for r in ranks)
    per_iter = [max(r["iteration_s"][i] for r in ranks) for i in range(n)]
    mean, std = _mean_std(per_iter)
    energies = [r["energy_j"] for r in ranks]
    sources = {r["energy_source"] for r in ranks}
    if None in energies:
        energy, source = None, None
    else:
        energy = float(sum(energies))
        source = "nvml" if sources == {"nvml"} else MODELLED
    ok = all(r["instructions_ok"] for r in ranks)
    other, other_per_iter = _host_other_cores(ranks, n)
    backends = {r["freq_backend"] for r in ranks}
    return {
        "status": "ok", "trial_id": job.trial_id, "world_size": len(ranks),
        "iteration_s_mean": mean, "iteration_s_std": std, "iteration_s": per_iter,
        "peak_memory_bytes_per_rank": [r["peak_memory_bytes"] for r in ranks],
        "memory_source": ranks[0]["memory_source"],
        "peak_reserved_bytes_per_rank": [r.get("peak_reserved_bytes") for r in ranks],
        "peak_device_used_bytes_per_rank": [r.get("peak_device_used_bytes") for r in ranks],
        "device_used_source": ranks[0].get("device_used_source"),
        # the allocator that ran (read back in the rank), for the record
        "allocator_settings": ranks[0].get("allocator_settings"),
        "expandable_segments": ranks[0].get("expandable_segments"),
        "energy_j_per_iter": energy, "energy_source": source,
        "freq_backend": sorted(backends)[0] if len(backends) == 1 else sorted(backends),
        "plan_applied": job.frequency_plan is not None and all(r.get("plan_applied") for r in ranks),
        "instructions_ok": ok,
        "instruction_mismatches": [r["instruction_mismatch"] for r in ranks if r["instruction_mismatch"]],
        "loss_first": ranks[0]["loss"][0] if ranks[0]["loss"] else None,
        "loss_last": ranks[0]["loss"][-1] if ranks[0]["loss"] else None,
        "startup_s": max((r["startup_s"] or 0.0) for r in ranks),
        # what ran: the attention the plan named, the kernels torch chose (a stage without blocks ran none), the
        # optimizer and the precision
        "attention": ranks[0].get("attention"),
        "attention_kernels": sorted({r["attention_kernel"] for r in ranks if r.get("attention_kernel")}),
        "optimizer": ranks[0].get("optimizer"), "dtype": job.dtype, "tf32": ranks[0].get("tf32"),
        "host_other_cores": other, "host_other_cores_per_iter": other_per_iter,
        **_replica_times(ranks, n),
        "wall_s": wall_s,
        "ranks": ranks,
    }


def _replica_times(ranks: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """Each data-parallel replica's share (micro-batches) and own time per timed iteration: the latest of its ranks'
    ``own_s`` (until they reached the gradient reduction), None where a rank did not report it; both None when the
    ranks do not say their replica and share."""
    if any("replica" not in r or "share" not in r for r in ranks):
        return {"replica_shares": None, "replica_own_s": None}
    replicas = sorted({r["replica"] for r in ranks})
    shares = [next(r["share"] for r in ranks if r["replica"] == q) for q in replicas]
    own: list[list[float | None]] = []
    for q in replicas:
        times = [r.get("own_s") or [] for r in ranks if r["replica"] == q]
        own.append([max(t[i] for t in times) if all(i < len(t) and t[i] is not None for t in times) else None
                    for i in range(n)])
    return {"replica_shares": shares, "replica_own_s": own}


def _host_other_cores(ranks: list[dict[str, Any]], n: int) -> tuple[float | None, list[float | None] | None]:
    """Cores other processes kept busy during the timed iterations (whole window, and per iteration), from rank 0's
    machine-wide reading and every rank's own CPU time (:mod:`ampe.measure.host_load`). None off Linux or when the
    ranks ran on several hosts (the machine reading covers one)."""
    from ampe.measure.host_load import other_cores

    lead = ranks[0]
    busy: list[float] | None = lead.get("machine_busy_s_per_iter")
    own: list[list[float]] = [r.get("cpu_s_per_iter") or [] for r in ranks]
    if not busy or any(b is None for b in busy[:n]) or any(not o for o in own) or \
            len({r.get("host") for r in ranks}) > 1:
        return None, None
    walls = lead["iteration_s"][:n]
    per_iter = [other_cores(0.0, busy[i], sum(o[i] for o in own), walls[i]) for i in range(n)]
    whole = other_cores(0.0, sum(busy[:n]), sum(sum(o[:n]) for o in own), sum(walls))
    return whole, per_iter
