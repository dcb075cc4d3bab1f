"""``ampe profile``: measure per-layer forward/backward time and activation memory into a profile CSV."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ampe.cli._common import add_seq_len
from ampe.errors import InputError


def _int_list(text: str, flag: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(flag, "", f"expected comma-separated positive integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise InputError(flag, "", f"expected comma-separated positive integers, got {text!r}")
    return sorted(set(vals))


def _recompute(text: str | None, attention: str, clocks: bool) -> list[str]:
    """``--recompute``: modes from none,selective,full, in that order; the default all three (selective only with
    eager attention), or only none with ``--clocks`` (the energy planner's per-clock options use none rows)."""
    modes = ("none", "selective", "full")
    if text is None:
        return ["none"] if clocks else [m for m in modes if m != "selective" or attention == "eager"]
    wanted = {x.strip() for x in text.split(",") if x.strip()}
    if not wanted or wanted - set(modes):
        raise InputError("--recompute", "", f"expected comma-separated modes from {','.join(modes)}, got {text!r}")
    return [m for m in modes if m in wanted]


def _at_clocks(text: str, measure: Any, say: Any) -> list:
    """Profile at each clock of ``--clocks`` on CUDA device 0, locked through NVML (ampe/profiling/clocks.py)."""
    from ampe.measure.freq import NvmlController, import_nvml
    from ampe.profiling.clocks import parse_clocks, profile_at_clocks, supported_clocks

    nvml = import_nvml()
    nvml.nvmlInit()
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"  # torch's cuda:0
    handle = nvml.nvmlDeviceGetHandleByIndex(int(first)) if first.isdigit() else \
        nvml.nvmlDeviceGetHandleByUUID(first)
    clocks = parse_clocks(text, supported_clocks(nvml, handle))
    return profile_at_clocks(clocks, NvmlController(handle, nvml, asynchronous=False), measure, say)


def register(subparsers: Any) -> None:
    """Add the ``profile`` subcommand."""
    p = subparsers.add_parser(
        "profile", help="measure per-layer times and activation memory (the profile CSV ampe search --profile reads)",
        description="Time every layer of a model the trial worker builds (forward, backward incl. tensor-parallel "
                    "all-reduces) under each activation recomputation, and measure the activation memory it keeps, "
                    "writing model,device,tp,mbs,layer,forward_s,backward_s,layer_kind,memory_bytes,attention,"
                    "recompute (+forward_j,backward_j,energy_source with NVML or --modelled-energy; "
                    "+same_as_layer with --identical-layers once). --merge merges profile CSVs instead. See "
                    "docs/worker.md and docs/reference/profile_csv.md.")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", metavar="NAME|MODEL.yaml|config.json",
                      help="a GPT-2/3 or Llama-family zoo model, a Hugging Face config.json (llama, mistral, qwen2, "
                           "gpt2), or a model YAML in the GPT layout (a layer list the worker cannot build is refused)")
    what.add_argument("--merge", nargs="+", metavar="PROFILE.csv",
                      help="measure nothing: merge these profile CSVs into --out, whatever their columns (with and "
                           "without energy, in any order); a row that differs from another file's row for the same "
                           "model, device, tp, layer, mbs, attention, recompute and clock is refused, an identical one "
                           "kept once")
    p.add_argument("--attention", choices=("auto", "eager", "flash"), default="auto",
                   help="attention kernel, recorded in every row: flash (torch SDPA) or eager (written out); auto: the "
                        "model's default (flash for 16-bit Llama-family models, eager for the GPT zoo and fp32)")
    add_seq_len(p)
    p.add_argument("--recompute", metavar="LIST", default=None,
                   help="activation recomputation modes to measure, comma-separated from none,selective,full, one row "
                        "per layer and mode (default: all three, selective only with eager attention, as the search "
                        "plans selective only there; with --clocks only none, what per-clock energy planning reads)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="measure on the CPU (one thread, fp32) or the first CUDA device (default cpu)")
    p.add_argument("--tp", default="1", help="tensor-parallel degrees, comma-separated (default 1)")
    p.add_argument("--mbs", default="1", help="micro-batch sizes, comma-separated (default 1)")
    p.add_argument("--warmup", type=int, default=3, help="untimed forward+backward pairs per layer (default 3)")
    p.add_argument("--repeats", type=int, default=10, help="timed pairs per layer; the median is kept (default 10)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default=None,
                   help="precision (default: the model's on cuda, fp32 on cpu)")
    p.add_argument("--clocks", metavar="all|MHZ,...",
                   help="cuda only: profile every layer once per SM clock, locked through NVML (rows get "
                   "sm_clock_mhz; the clock is always reset afterwards, on errors and on SIGTERM/SIGINT; needs root "
                   "or CAP_SYS_ADMIN). `ampe search --profile` then plans energy from these measurements")
    p.add_argument("--no-energy", action="store_true",
                   help="cuda: skip each layer's NVML energy reading (0.5 s of repeats per layer, mode and "
                   "micro-batch size; without it the CSV has no energy columns)")
    p.add_argument("--modelled-energy", action="store_true",
                   help="cpu: also write forward_j/backward_j from the CPU's modelled power (catalog busy power × "
                   "time over each layer's 0.5 s window), labelled energy_source 'modelled …': the columns a GPU "
                   "profile has, never a measurement (the GPU check's dry run)")
    p.add_argument("--identical-layers", choices=("each", "once"), default="each",
                   help="once: measure the first of identical layers only (a model's transformer blocks) and repeat "
                   "its rows for the others, each marked same_as_layer (default each: measure every layer)")
    p.add_argument("--out", required=True, help="profile CSV to write")
    p.add_argument("--sharing", action="store_true",
                   help="cpu only: also measure how much throughput a core keeps when two trial ranks time-share "
                        "it, and print the `sharing_efficiency:` to put on a cluster node with `processors:` "
                        "(about a minute; ampe/profiling/sharing.py)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.merge is not None:
        return _merge(args.merge, args.out)
    from ampe.profiling import bounds

    bounds.check_counts(args.warmup, args.repeats)  # before torch is imported (the profiler imports it)
    from ampe.cli._common import load_model_arg
    from ampe.profiling.profiler import check_buildable

    tps, mbss = _int_list(args.tp, "--tp"), _int_list(args.mbs, "--mbs")
    model = load_model_arg(args)
    try:
        check_buildable(model)
    except ValueError as e:
        raise InputError("--model", "", str(e)) from None
    recompute = _recompute(args.recompute, model.attention, args.clocks is not None)
    dtype = _checked_dtype(args, model, tps)
    from ampe.costmodel.catalog import CATALOG

    if args.device == "cpu":  # before torch is imported: the whole run is estimated and bounded first
        cost = bounds.estimate(model, CATALOG["cpu"], tps, mbss, args.warmup, args.repeats, dtype, shared=True,
                               modes=len(recompute), energy=args.modelled_energy)
        bounds.check(cost, bounds.cpu_memory_available(), model, "this machine")
    import torch

    if args.device == "cuda":
        _check_cuda(args, model, tps, mbss, dtype, len(recompute))
    from ampe.profiling.profiler import profile, write_profile_csv

    def say(msg: str) -> None:
        print(f"ampe profile: {msg}", file=sys.stderr)

    def measure() -> list:
        return profile(args.model, args.device, tps, mbss, args.warmup, args.repeats, dtype, progress=say,
                       attention=model.attention, recompute=recompute, seq_len=args.seq_len,
                       read_energy=args.modelled_energy if args.device == "cpu" else not args.no_energy,
                       identical=args.identical_layers)

    try:
        rows = measure() if args.clocks is None else _at_clocks(args.clocks, measure, say)
    except ValueError as e:  # e.g. an uncatalogued GPU
        raise InputError("--device", "", str(e)) from None
    except torch.multiprocessing.ProcessExitedException as e:  # a tensor-parallel profiling process died
        sys.stderr.write(f"ampe profile: error: a profiling process failed ({e}); nothing was written\n")
        return 1
    write_profile_csv(rows, args.out)
    sys.stderr.write(f"ampe profile: wrote {len(rows)} rows to {args.out}\n")
    return _sharing(args.model, mbss[0]) if args.sharing else 0


def _checked_dtype(args: argparse.Namespace, model: Any, tps: list[int]) -> str:
    """The dtype to profile in, after refusing flags that contradict each other, the device or the model."""
    from ampe.costmodel.runnable import tp_problems

    for tp in tps:
        problems = tp_problems(model, tp)
        if problems:
            raise InputError("--tp", "", "; ".join(problems))
    if args.clocks is not None and args.device != "cuda":
        raise InputError("--clocks", "", "locking GPU clocks needs --device cuda (and NVML)")
    if args.clocks is not None and max(tps) > 1:
        raise InputError("--clocks", "", "per-clock profiling locks one GPU: use --tp 1")
    if args.modelled_energy and args.device != "cpu":
        raise InputError("--modelled-energy", "", "modelled energy stands in for a meter on the cpu only (cuda reads "
                         "NVML; --no-energy skips it)")
    if args.sharing and args.device != "cpu":
        raise InputError("--sharing", "", "time-sharing efficiency is a CPU-emulation figure (use --device cpu)")
    dtype: str = args.dtype or (model.dtype if args.device == "cuda" else "fp32")
    if args.device == "cpu" and dtype == "fp16":
        raise InputError("--dtype", "", "fp16 is not supported on cpu (use fp32 or bf16)")
    return dtype


def _check_cuda(args: argparse.Namespace, model: Any, tps: list[int], mbss: list[int], dtype: str,
                modes: int) -> None:
    """Refuse a CUDA run this machine cannot do: no CUDA device, too few for the largest tp, or the whole run's
    estimated memory beyond cuda:0's free memory."""
    import torch

    from ampe.costmodel.catalog import CATALOG
    from ampe.profiling import bounds

    if not torch.cuda.is_available():
        raise InputError("--device", "", "cuda requested but torch sees no CUDA device")
    if max(tps) > torch.cuda.device_count():
        raise InputError("--tp", "", f"tp={max(tps)} needs that many GPUs, {torch.cuda.device_count()} visible")
    from ampe.profiling.profiler import catalog_gpu_name

    props = torch.cuda.get_device_properties(0)
    try:
        gpu = CATALOG[catalog_gpu_name(torch.cuda.get_device_name(0), props.total_memory)]
    except (ValueError, KeyError):  # an uncatalogued GPU: the profiler itself says so below
        gpu = CATALOG["H100-80GB"]
    cost = bounds.estimate(model, gpu, tps, mbss, args.warmup, args.repeats, dtype, energy=not args.no_energy,
                           modes=modes)
    bounds.check(cost, float(torch.cuda.mem_get_info(0)[0]), model, f"cuda:0 ({gpu.name})")


def _sharing(model_name: str, mbs: int) -> int:
    """``--sharing``: measure and print the time-sharing efficiency (exit status 1 when it cannot be measured)."""
    from ampe.profiling.sharing import measure_sharing_efficiency

    sys.stderr.write("ampe profile: measuring time-sharing efficiency (one, then two ranks per core)\n")
    try:
        m = measure_sharing_efficiency(model_name, mbs=mbs)
    except RuntimeError as e:  # a worker failed or the machine is too busy: the profile CSV is still written
        sys.stderr.write(f"ampe profile: sharing efficiency not measured: {e}\n")
        return 1
    sys.stderr.write(f"ampe profile: {m.describe()}\n")
    print(f"sharing_efficiency: {min(m.efficiency, 1.0):.3f}")
    return 0


def _merge(paths: list[str], out: str) -> int:
    """``--merge``: the files' rows under one header (:func:`ampe.formats.profile.merge_profile_csvs`) into ``out``."""
    from ampe.formats.profile import merge_profile_csvs
    from ampe.io import write_text_atomic

    text = merge_profile_csvs(paths)
    write_text_atomic(out, text)
    sys.stderr.write(f"ampe profile: merged {text.count(chr(10)) - 1} rows of {len(paths)} files into {out}\n")
    return 0
