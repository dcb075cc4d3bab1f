"""A stand-in for ``ampe.runtime.worker`` that honours the trial contract (docs/trials.md) without torch.

Run like the real worker (``python fake_worker.py JOB.json`` under torchrun or the runner's local launcher). It
"trains" by sleeping, writes progress.json, rank{R}.json, result.json and error_rank{R}.json exactly as the
contract says, and misbehaves on request. Behaviour comes from the JSON in env ``AMPE_FAKE_CONTROL``::

    {"iter_s": 0.01,                                   # default seconds per iteration
     "pp2dp1tp1mbs2": {"mode": "oom", "rank": 1,       # per strategy, keyed pp{pp}dp{dp}tp{tp}mbs{mbs}
                       "at": 2, "iter_s": 0.02, "alloc_bytes": 1073741824}}

modes: ``ok``; ``oom`` (every rank allocates ``alloc_bytes``, which fails only under a memory limit);
``hang`` (``rank`` stops at iteration ``at`` forever); ``crash`` (``rank`` raises at ``at``); ``kill`` (``rank``
SIGKILLs itself at ``at``); ``exit`` (``rank`` exits 3 at ``at`` without an error file); ``badresult`` (rank 0
writes a result.json without iteration times). ``"watchdog": false`` leaves out the watch on the runner that ampe's
worker keeps (:func:`ampe.runnermark.watch_runner`). ``"baton": true`` makes ``rank`` first take torch's build lock of
DeepSpeed's CPU op in ``$TORCH_EXTENSIONS_DIR`` the way torch does (created with ``O_EXCL`` and held open), as a rank
does while it builds or checks the op, and never release it (combine with ``hang``: a rank killed at that moment).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time
from pathlib import Path


def _write_json(path: Path, obj: object) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    out = Path(job["out_dir"])
    s = job["strategy"]
    control = json.loads(os.environ.get("AMPE_FAKE_CONTROL", "{}"))
    spec = control.get(f"pp{s['pp']}dp{s['dp']}tp{s['tp']}mbs{s['mbs']}", {})
    mode = spec.get("mode", "ok")
    target = spec.get("rank", world - 1)
    at = spec.get("at", 1)
    iter_s = float(spec.get("iter_s", control.get("iter_s", 0.01)))
    if control.get("watchdog", True):  # as ampe's worker does; off: a rank that does not watch (the user's script)
        from ampe.runnermark import watch_runner

        watch_runner(f"fake worker rank {rank}")
    planned = job["frequency_plan"] is not None and job["freq_backend"] != "none"
    stretch = float(spec.get("stretch", 1.1)) if planned else 1.0
    if spec.get("baton") and rank == target:
        op = Path(os.environ["TORCH_EXTENSIONS_DIR"]) / "deepspeed_shm_comm"
        op.mkdir(parents=True, exist_ok=True)
        baton = os.open(op / "lock", os.O_CREAT | os.O_EXCL)  # noqa: F841 - held open, as torch's FileBaton
    try:
        if mode == "oom":  # the model's memory; calloc'd by bytes(), so untouched pages cost nothing without a limit
            hog = bytes(int(spec.get("alloc_bytes", 1 << 30)))  # noqa: F841
        n_warm, n_timed = job["warmup_iters"], job["timed_iters"]
        times = []
        for i in range(n_warm + n_timed):
            if rank == target and i == at:
                if mode == "hang":
                    while True:
                        time.sleep(1)
                if mode == "crash":
                    raise RuntimeError("fake worker crashed on purpose")
                if mode == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if mode == "exit":
                    sys.exit(3)
            t0 = time.perf_counter()
            time.sleep(iter_s * stretch)
            if i >= n_warm:
                times.append(time.perf_counter() - t0)
            if rank == 0:
                _write_json(out / "progress.json", {"iteration": i + 1, "of": n_warm + n_timed})
        stage, rest = divmod(rank, s["dp"] * s["tp"])
        replica, shard = divmod(rest, s["tp"])
        energy = 10.0 * iter_s * (0.8 if planned else 1.0)
        _write_json(out / f"rank{rank}.json", {
            "rank": rank, "stage": stage, "replica": replica, "shard": shard, "device": s["placement"][rank],
            "iteration_s": times, "peak_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "memory_source": "rss_peak", "energy_j": energy, "energy_source": "modelled",
            "instructions_ok": True if planned else None, "instruction_mismatch": None,
            "emulated": {"stretch_s": iter_s * (stretch - 1)} if planned else None})
        if rank == 0:
            while not all((out / f"rank{r}.json").exists() for r in range(world)):  # the barrier
                time.sleep(0.01)
            ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
            per_iter = [max(r["iteration_s"][k] for r in ranks) for k in range(n_timed)]
            mean = sum(per_iter) / len(per_iter)
            result = {"status": "ok", "iteration_s_mean": mean,
                      "iteration_s_std": (sum((x - mean) ** 2 for x in per_iter) / len(per_iter)) ** 0.5,
                      "iteration_s": per_iter, "peak_memory_bytes_per_rank": [r["peak_memory_bytes"] for r in ranks],
                      "energy_j_per_iter": sum(r["energy_j"] for r in ranks),
                      "energy_source": "modelled (no energy counter on this machine)", "plan_applied": planned}
            if mode == "badresult":
                result = {"status": "ok"}
            _write_json(out / "result.json", result)
        return 0
    except MemoryError as e:
        _write_json(out / f"error_rank{rank}.json", {"kind": "oom", "message": f"MemoryError: {e}"})
        return 1
    except Exception as e:
        _write_json(out / f"error_rank{rank}.json", {"kind": "crash", "message": f"{type(e).__name__}: {e}"})
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
