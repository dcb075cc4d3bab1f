"""``ampe export``: one strategy of a plan, written out for the user's own DeepSpeed training script.

The strategy is prepared exactly as ``ampe trial`` would run it (:func:`ampe.trials.prepare.prepare`: the same
validation, frequency backend, job file and launch pieces from :mod:`ampe.trials.commands` and
:mod:`ampe.trials.hostfile`), then written to a folder:

* ``export.json`` — ``ampe.export/1`` (:class:`~ampe.formats.export.ExportFile`): strategy, ``parts``, rank → host and
  device map, master address, DeepSpeed config, frequency plan; what :mod:`ampe.runtime.user` reads in every rank;
* ``ds_config.json`` — the DeepSpeed config;
* ``frequency_plan.json`` — the per-stage clocks (only when the plan has them);
* ``hostfile`` and ``.deepspeed_env`` — for DeepSpeed's multi-node runner (it exports the variables in
  ``./.deepspeed_env`` to every host);
* ``launch.sh`` — the launch command for the user's script; ``launch_worker.sh`` and ``worker/job.json`` — the same
  launch of ampe's own worker (a smoke test of the cluster before the user's run). On CPU both first build
  DeepSpeed's CPU op (``python -m ampe.runtime.prebuild``) in the ``TORCH_EXTENSIONS_DIR`` they give the ranks;
* ``commands.json`` — both commands as argument vectors plus their environment (and the prebuild command);
* ``README.md`` — what to paste where.

docs/export.md is the reference.
"""

from __future__ import annotations

import itertools
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ampe.costmodel.model import Model
from ampe.costmodel.strategy import Strategy
from ampe.costmodel.training import deepspeed_config, loss_weight, replica_deepspeed_config
from ampe.costmodel.zoo import load_model
from ampe.errors import InputError
from ampe.formats.export import ExportFile
from ampe.outfolder import EXEC_MODE, FILE_MODE, OutputFolder, check_folder
from ampe.trials.buildlock import prebuild_argv
from ampe.trials.commands import base_env, deepspeed_argv, torchrun_argv, worker_args
from ampe.trials.hostfile import HostLayout, UnrealizablePlacementError, host_layout
from ampe.trials.launch import choose_launcher, env_file_text, job_dict
from ampe.trials.prepare import PlannedTrial, RunContext, TrialOptions, prepare
from ampe.units import si

DEFAULT_MASTER_PORT = 29500
WORKER = "ampe.runtime.worker"
EXPORT_ENV = "AMPE_EXPORT"  # the variable that tells ampe.runtime.load_export() where export.json is


DEFAULT_SCRIPT = "train.py"


@dataclass(frozen=True)
class ExportOptions:
    """What to export and how to launch it. Ports are TCP ports; paths are as given."""

    out_dir: Path
    plan_rank: int = 1
    # the user's training script (path) or module (dotted name); None: train.py, which must then exist here
    script: str | None = "train.py"
    launcher: str = "auto"  # auto | torchrun | deepspeed
    freq_backend: str = "auto"  # auto | nvml | emulate | none (auto: as `ampe trial` chooses)
    host_map: Mapping[str, str] | None = None  # cluster node name → hostname
    cluster_spec: str | None = None  # overrides the plan's
    master_port: int = DEFAULT_MASTER_PORT
    dtype: str | None = None  # default: fp32 on CPU, the model's on GPUs (as `ampe trial`)
    warmup_iters: int = 2  # for ampe's worker (launch_worker.sh)
    timed_iters: int = 5


@dataclass(frozen=True)
class Exported:
    """What :func:`export_plan` wrote: the export record and the files (name → path)."""

    export: ExportFile
    files: dict[str, Path]
    user_argv: tuple[str, ...]
    worker_argv: tuple[str, ...]
    env: dict[str, str]


def export_plan(plan: str | Path, options: ExportOptions) -> Exported:
    """Write strategy ``options.plan_rank`` of ``plan`` to ``options.out_dir`` (see the module docstring).

    Raises :class:`InputError` for a bad plan, a rank the plan lacks, a schedule stock DeepSpeed cannot run or a
    placement the DeepSpeed launcher cannot express."""
    if options.launcher not in ("auto", "torchrun", "deepspeed"):
        raise InputError("--launcher", "", f"must be auto, torchrun or deepspeed, got {options.launcher!r}")
    if not 1 <= options.master_port <= 65535:
        raise InputError("--master-port", "", f"must be a TCP port 1..65535, got {options.master_port}")
    check_folder(options.out_dir, "--out")  # before any work: not empty, no file, no link to nothing
    out = Path(os.path.realpath(options.out_dir))  # where OutputFolder will open (or create) it; nothing made yet
    ctx, t = _prepared(plan, options, out)
    s = t.strategy
    layout, kind = _launch_layout(ctx, t, options)
    export_path = out / "export.json"
    script = _script_ref(options.script)
    master_addr = layout.hosts[0][0] if kind == "deepspeed" else "127.0.0.1"
    env = base_env(ctx.device, {EXPORT_ENV: str(export_path)}, t.strategy.expandable_segments)
    hostfile = out / "hostfile"
    user_args = [script] if script.endswith(".py") else ["-m", script]
    job_path = out / "worker" / "job.json"
    w_args = worker_args(WORKER, str(job_path))
    if kind == "deepspeed":
        user_argv = deepspeed_argv(str(hostfile), layout, options.master_port, user_args, master_addr)
        worker_argv = deepspeed_argv(str(hostfile), layout, options.master_port, w_args, master_addr)
    else:
        user_argv = torchrun_argv(s.world_size, user_args)
        worker_argv = torchrun_argv(s.world_size, w_args)

    fplan = None
    if t.schedule is not None:
        job = job_dict(ctx, t, job_path.parent)  # adds each stage's GPU type, as the trial runner does
        fplan = job["frequency_plan"]
    export = _export_file(ctx, t, layout, kind, master_addr, fplan, options, out)
    before = prebuild_argv() if ctx.device == "cpu" else None  # DeepSpeed's CPU op, once, before any rank starts
    contents: dict[str, Any] = {"export.json": export.to_json(), "ds_config.json": export.deepspeed}
    if fplan is not None:
        contents["frequency_plan.json"] = fplan
    contents.update(_replica_configs(s, ctx.dtype))
    contents.update({
        "hostfile": layout.hostfile_text(), ".deepspeed_env": env_file_text(env),
        "worker/job.json": job_dict(ctx, t, job_path.parent),
        "launch.sh": _shell(user_argv, env, f"the user's script under plan rank {t.planned.rank}", extra=True,
                            prebuild=before),
        "launch_worker.sh": _shell(worker_argv, env, f"ampe's own worker under plan rank {t.planned.rank}",
                                   prebuild=before),
        "commands.json": {"launcher": kind, "cwd": str(out), "env": env, "prebuild": before, "user": user_argv,
                          "worker": worker_argv}})
    files = {name: out / name for name in [*contents, "README.md"]}
    model = load_model(ctx.plan.model, ctx.attention)
    contents["README.md"] = readme(export, files, kind, script, layer_layout(model, export.parts), ctx.plan.profile)
    _write_files(options.out_dir, contents)
    return Exported(export, files, tuple(user_argv), tuple(worker_argv), env)


def _prepared(plan: str | Path, options: ExportOptions, out: Path) -> tuple[RunContext, PlannedTrial]:
    """The plan read and checked as the trial runner reads it, and the trial of ``options.plan_rank``."""
    trial_opts = TrialOptions(out_dir=out, top_k=10 ** 9, run_unfit=True, baseline=False,
                              freq_backend=options.freq_backend, cluster_spec=options.cluster_spec,
                              host_map=dict(options.host_map or {}), dtype=options.dtype,
                              warmup_iters=options.warmup_iters, timed_iters=options.timed_iters,
                              launcher="local",  # the launch is built here, not by the runner
                              own_layers=False)  # the user's script may bring its own layers
    ctx, trials, left_out = prepare(plan, trial_opts)
    return ctx, _pick(ctx, trials, left_out, options.plan_rank)


def _launch_layout(ctx: RunContext, t: PlannedTrial, options: ExportOptions) -> tuple[HostLayout, str]:
    """The strategy's hosts and slots, and the launcher that runs it (torchrun or deepspeed); InputError for a
    placement the launcher cannot express."""
    s = t.strategy
    placement = s.placement or tuple(range(s.world_size))
    try:
        layout = host_layout(ctx.cluster, placement, options.host_map)
    except UnrealizablePlacementError as e:
        raise InputError(ctx.plan.source, f"strategies[{t.planned.index}].placement", str(e)) from None
    kind = choose_launcher(options.launcher, ctx.cluster, placement)
    if kind == "local":  # only reachable through TrialOptions; export never launches that way
        kind = "torchrun"
    if kind == "torchrun" and len(layout.hosts) > 1:
        raise InputError("--launcher", "", f"torchrun runs one host; this strategy spans {len(layout.hosts)} "
                         "(use deepspeed)")
    return layout, kind


def _export_file(ctx: RunContext, t: PlannedTrial, layout: HostLayout, kind: str, master_addr: str,
                 fplan: Any, options: ExportOptions, out: Path) -> ExportFile:
    """``export.json``: what the user's script reads (validated as the runtime reads it)."""
    s = t.strategy
    return ExportFile.parse({
        "schema": "ampe.export/1", "plan": str(Path(ctx.plan.source).resolve()), "plan_rank": t.planned.rank,
        "model": ctx.plan.model, **({"seq_len": ctx.plan.seq_len} if ctx.plan.seq_len else {}),
        "cluster": ctx.cluster.name, "cluster_spec": str(Path(ctx.cluster.source).resolve()),
        "device": ctx.device, "dtype": ctx.dtype, "strategy": s.to_dict(), "parts": list(s.partition or ()),
        "ranks": _rank_map(ctx, t, layout, options.host_map or {}),
        "hosts": [{"host": h, "slots": n, "used": list(used)} for h, n, used in layout.hosts],
        "launcher": kind, "master_addr": master_addr, "master_port": options.master_port,
        "freq_backend": t.backend, "frequency_plan": fplan,
        "deepspeed": deepspeed_config(s, ctx.dtype),
        "predicted": t.planned.predicted.model_dump(mode="json", exclude_none=True),
        "measurements": str(out / "measurements.jsonl")}, str(out / "export.json"))


def _write_files(out_dir: str | Path, contents: dict[str, Any]) -> None:
    """Every file of the export into ``out_dir`` (text as it is, the scripts executable; the rest as JSON), and an
    earlier export's replica configs and clocks this one does not write removed (beside equal shares they would
    mislead)."""
    with OutputFolder(out_dir, "--out") as folder:  # every file is written through it, never through a link
        folder.check_files(list(contents))  # a link or folder in a file's place: refused before anything is written
        for name, content in contents.items():
            if isinstance(content, str):  # the scripts are executable as written: no chmod that could follow a link
                folder.write_text(name, content, EXEC_MODE if name.endswith(".sh") else FILE_MODE)
            else:
                folder.write_json(name, content)
        for stale in ("ds_config_replica*.json", "frequency_plan.json"):
            folder.remove_stale(stale, contents)


def _pick(ctx: RunContext, trials: list[PlannedTrial], left_out: list, rank: int) -> PlannedTrial:
    """The prepared trial of plan rank ``rank`` (its scheduled variant when the backend applies one)."""
    mine = [t for t in trials if t.planned.rank == rank]
    if mine:
        return next((t for t in mine if t.schedule is not None), mine[0])
    skipped = [r for r in left_out if r.plan_rank == rank]
    if skipped:
        raise InputError("--rank", "", f"plan rank {rank} cannot be exported: {skipped[0].reason}")
    ranks = sorted(p.rank for p in ctx.plan.strategies)
    raise InputError("--rank", "", f"{ctx.plan.source} has no strategy of rank {rank} (ranks {ranks[0]}..{ranks[-1]})")


def _replica_configs(s: Strategy, dtype: str) -> dict[str, Any]:
    """Under uneven shares each replica's DeepSpeed config file (its ranks start with their own share, docs/export.md
    "Uneven shares"); nothing under equal shares."""
    return {replica_config_name(r): replica_deepspeed_config(s, r, dtype) for r in range(s.dp)} if s.uneven else {}


def replica_config_name(replica: int) -> str:
    """The export's DeepSpeed config file of one data-parallel replica under uneven shares."""
    return f"ds_config_replica{replica}.json"


_SHARES_FILES = ("\n* `ds_config_replica<r>.json`: each replica's own DeepSpeed config (uneven shares, below): give "
                 "replica r's ranks this one, not `ds_config.json` (the largest share's).")


def _shares_section(e: ExportFile) -> str:
    """The README's words on uneven shares: each replica's micro-batches, DeepSpeed config and loss weight; empty
    under equal shares."""
    s = e.strategy
    per = s.get("replica_gas")
    if not per:
        return ""
    rows = "\n".join(f"| {r} | {g} | {g * s['mbs']} | `{replica_config_name(r)}` | {loss_weight(per, r):.6g} |"
                      for r, g in enumerate(per))
    return f"""
## Uneven shares: each replica runs its own number of micro-batches

| replica | micro-batches (gas) | samples | DeepSpeed config | loss weight |
| --- | --- | --- | --- | --- |
{rows}

Each rank of replica r starts DeepSpeed with that replica's config (`plan.deepspeed_config()` returns it: its own
`gradient_accumulation_steps` and `train_batch_size` = mbs·gas·dp, what DeepSpeed's batch check wants), multiplies
its loss by the replica's weight, gas·dp/Σgas (`plan.weighted_loss(my_loss)`; `plan.model_loss()` is weighted
already), and reads gas micro-batches per iteration of its own samples (replica r reads micro-batches
Σ_{{q<r}} gas_q .. of each global batch). Then one optimizer step equals the step of equal shares over the same
samples: DeepSpeed divides each rank's loss by its own gas and averages over dp; the weight undoes the difference.
`ds_config.json` is the plan's config (the largest share): do not give it to every rank.
"""


def _rank_map(ctx: RunContext, t: PlannedTrial, layout: HostLayout, host_map: Mapping[str, str]) -> list[dict]:
    s = t.strategy
    out = []
    for rank in range(s.world_size):
        stage, rest = divmod(rank, s.dp * s.tp)
        replica, shard = divmod(rest, s.tp)
        dev = ctx.cluster.devices[s.placement[rank] if s.placement else rank]
        out.append({"rank": rank, "stage": stage, "replica": replica, "shard": shard, "device": dev.id,
                    "node": dev.node, "host": host_map.get(dev.node, dev.node), "local_index": dev.local_index,
                    "gpu": dev.gpu.name})
    return out


def _script_ref(script: str | None) -> str:
    """A script path made absolute (launch.sh changes into the export folder); a module name as given. None (no
    ``--script``) stands for ``train.py`` in the working folder, refused when it is not there: launch.sh would
    otherwise end in torchrun's traceback. A script named explicitly may be written after the export."""
    if script is None:
        if not Path(DEFAULT_SCRIPT).is_file():
            raise InputError("--script", "", f"not given, and the default {DEFAULT_SCRIPT} is not in "
                             f"{Path.cwd()}: pass --script YOUR_SCRIPT.py (or a module name, e.g. --script pkg.train)")
        script = DEFAULT_SCRIPT
    if script.endswith(".py"):
        return str(Path(script).resolve())
    if not script.replace(".", "").replace("_", "").isalnum():
        raise InputError("--script", "", f"must be a .py path or a dotted module name, got {script!r}")
    return script


def _shell(argv: list[str], env: Mapping[str, str], what: str, extra: bool = False,
           prebuild: list[str] | None = None) -> str:
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
    tail = ' "$@"' if extra else ""
    build = ""
    if prebuild:
        build = ("# DeepSpeed's CPU comm op, built once (one line says so) in $TORCH_EXTENSIONS_DIR under ampe's "
                 "lock, so no\n# rank waits on a build lock a killed build left behind (docs/export.md).\n"
                 f"{shlex.join(prebuild)}\n")
    return (f"#!/bin/sh\n# ampe export: launch {what}. Generated; see README.md.\nset -e\n"
            "# DeepSpeed reads ./.deepspeed_env, and every host changes into this same folder.\n"
            f'cd "$(dirname "$0")"\n{exports}{build}exec {shlex.join(argv)}{tail}\n')


def _recompute_line(strategy: Mapping[str, Any]) -> str:
    """What the README says about the plan's activation recomputation (per stage where the stages differ)."""
    per_stage = strategy.get("stage_recompute") or [strategy.get("recompute", "none")] * int(strategy["pp"])
    if set(per_stage) == {"none"}:
        return "none."
    return (f"per stage {per_stage}. `plan.pipeline_module` checkpoints every layer of a `full` stage "
            "(`activation_checkpoint_interval=1`); `selective` means re-running core attention in backward, inside "
            "your own layers.")


def layer_layout(model: Model, parts: list[int] | None = None) -> str:
    """The model's layer list as runs of layer kinds, one ``LayerSpec`` each: ``0 embedding | 1..32 transformer |
    33 norm | 34 logits | 35 noop`` (the Llama family: L + 4 entries). With ``parts``, one line per stage follows:
    ``stage 0: layers 0..14 = embedding, transformer ×14``."""
    kinds = [layer.kind for layer in model.layers]

    def runs(lo: int, hi: int) -> list[tuple[int, int, str]]:
        out: list[tuple[int, int, str]] = []
        for i in range(lo, hi):
            if out and out[-1][2] == kinds[i]:
                out[-1] = (out[-1][0], i, kinds[i])
            else:
                out.append((i, i, kinds[i]))
        return out

    text = f"{len(kinds)} entries: " + " | ".join(f"{a} {k}" if a == b else f"{a}..{b} {k}"
                                                   for a, b, k in runs(0, len(kinds)))
    if parts:
        for j, (a, b) in enumerate(itertools.pairwise(parts)):
            what = ", ".join(k if y == x else f"{k} ×{y - x + 1}" for x, y, k in runs(a, b))
            text += f"\n  stage {j}: layers {a}..{b - 1} = {what}"
    return text


def _tf32_words(s: dict[str, Any]) -> str:
    """", TF32 on/off (set by select_device)" where the strategy names it."""
    if s.get("tf32") is None:
        return ""
    return (f", TF32 {'on' if s['tf32'] else 'off'} for fp32 matrix products (`plan.select_device()` sets "
            "`torch.backends.cuda.matmul.allow_tf32` and cuDNN's)")


def _predicted_line(e: ExportFile, applied: bool) -> str:
    """What the plan predicts per iteration: with the frequency plan where the export applies one, and with every
    clock at its maximum beside it (labelled)."""
    p = e.predicted
    if p is None:
        return "The plan records no prediction for this strategy."
    at_max = f"{p.max_clock_time_s or p.iteration_s:.4g} s" + (
        "" if p.energy_max_clock_j is None else f", {si(p.energy_max_clock_j, 'J')}")
    kind = (p.energy_source or "").split(" ")[0].rstrip(":;,")
    source = f", energy {kind}" if kind else ""
    if applied and p.plan_time_s is not None and p.energy_j is not None:
        return (f"Predicted per iteration **with the frequency plan: {p.plan_time_s:.4g} s, {si(p.energy_j, 'J')}** "
                f"(all devices{source}); with every clock at its maximum: {at_max}.")
    unapplied = "" if p.plan_time_s is None or p.energy_j is None or p.energy_j == p.energy_max_clock_j else (
        f" The plan's frequency plan ({p.plan_time_s:.4g} s, {si(p.energy_j, 'J')}) is not applied: backend "
        f"`{e.freq_backend}`.")
    return f"Predicted per iteration with every clock at its maximum: {at_max} (all devices{source}).{unapplied}"


def _launch_notes(e: ExportFile, kind: str) -> tuple[str, str]:
    """The README's notes on the CPU op's prebuild (CPU only) and on a multi-host launch (deepspeed only); empty
    where they do not apply."""
    prebuilt = ""
    if e.device == "cpu":
        prebuilt = ("\n  On CPU both first run `python -m ampe.runtime.prebuild`: it builds DeepSpeed's CPU comm op "
                    "once (saying so in one line) in the `TORCH_EXTENSIONS_DIR` they give the ranks, and clears a "
                    "build lock a killed build left behind. Run it first if you launch the commands of `commands.json` "
                    "yourself.")
    multi = ""
    if kind == "deepspeed":
        multi = ("\nMulti-host: DeepSpeed's runner reaches every host over ssh (pdsh), so it needs password-less ssh, "
                 "the same Python environment and this folder (and your script) at the same path on every host. It "
                 "exports the variables of `.deepspeed_env` to every host. Ranks are numbered host by host in "
                 f"hostfile order; rank 0 runs on `{e.master_addr}`, the master address.\n")
    return prebuilt, multi


def _usage(e: ExportFile, profile: str | None) -> str:
    """The README's closing sections: what to paste into the user's script, and the ``ampe report`` command that
    reads its measurements back."""
    report = shlex.join(["ampe", "report", "--measurements", str(e.measurements), "--cluster", str(e.cluster_spec),
                         "--model", e.model] + (["--profile", profile] if profile else []))
    return f"""## What to paste into your script

```python
import deepspeed
from ampe.runtime import load_export

plan = load_export()                    # $AMPE_EXPORT, set by launch.sh
plan.check_host()                       # this rank runs where the plan says (warns, strict=True raises)
plan.select_device()                    # pin the core (CPU) or select the GPU of this rank
deepspeed.init_distributed(dist_backend=plan.dist_backend)
pipe = plan.pipeline_module(my_layer_specs, loss_fn=plan.weighted_loss(my_loss))  # exactly these parts
engine, _, _, _ = deepspeed.initialize(model=pipe, model_parameters=pipe.parameters(),
                                       config=plan.deepspeed_config())
freq = plan.install_frequency_hook(engine)  # backend: {e.freq_backend} (nvml | emulate | none)
with plan.recorder(freq, warmup=2) as rec:  # appends to {e.measurements}
    for step in range(steps):
        rec.step(engine.train_batch, data_iter=my_iter)
```

Then feed the measurements back (every path absolute: it runs from any folder):

```bash
{report}
```
"""


def readme(e: ExportFile, files: Mapping[str, Path], kind: str, script: str, layout: str | None = None,
           profile: str | None = None) -> str:
    """The export folder's README.md: what each file is and what to paste where. ``layout``: the model's layer list
    (:func:`layer_layout`); ``profile``: the plan's profile (absolute), for the closing ``ampe report`` command."""
    s = e.strategy
    rows = "\n".join(f"| {r.rank} | {r.stage} | {r.replica} | {r.shard} | {r.host} | {r.node} | {r.local_index} | "
                     f"{r.gpu} |" for r in e.ranks)
    stages = ", ".join(f"stage {j}: layers {a}..{b - 1}" for j, (a, b) in enumerate(zip(e.parts, e.parts[1:],
                                                                                       strict=False)))
    applied = "frequency_plan.json" in files
    freq = ("`frequency_plan.json`: per-stage SM clocks of every forward/backward, applied by the hook "
            f"(suggested backend: `{e.freq_backend}`)." if applied else
            "No frequency plan: the plan has none for this strategy (or the backend is `none`).")
    prebuilt, multi = _launch_notes(e, kind)
    layers = ("" if layout is None else
              f"\n\n## The layer list your `LayerSpec`s must follow\n\n```\n{layout}\n```\n\n"
              "One `LayerSpec` per entry, in this order: the partition counts entries, so a list with another order "
              "or length puts other layers on each stage than the plan costed. `plan.model_layer_specs()` builds "
              "exactly this list for ampe's GPT and Llama families.")
    return f"""# ampe export: plan rank {e.plan_rank} of {e.plan}

pp={s['pp']} dp={s['dp']} tp={s['tp']} mbs={s['mbs']} gbs={s['gbs']} (gas {s['gas']}), schedule {s['schedule']},
{e.device}, {e.dtype}{_tf32_words(e.strategy)}. {_predicted_line(e, applied)}{layers}

## Files

* `export.json`: everything below in one file; `ampe.runtime.load_export()` reads it (path in `$AMPE_EXPORT`).
* `ds_config.json`: the DeepSpeed config (`deepspeed.initialize(..., config="ds_config.json")`). Its `optimizer`
  block is the planner's default; drop it if your script passes its own optimizer. ZeRO-1, where the plan uses
  it, is its `zero_optimization` block.
* Activation recomputation: {_recompute_line(e.strategy)}
* Pipeline `parts` = {e.parts} ({stages}). Your `LayerSpec` list must have {e.parts[-1]} entries, in the order the
  plan's model lists its layers{" (above)" if layout else ""}.
* `hostfile`, `.deepspeed_env`: for DeepSpeed's multi-node runner.{_SHARES_FILES if s.get("replica_gas") else ""}
* {freq}
* `launch.sh`: the launch command ({kind}) for `{script}`; extra arguments go to the script.
  `launch_worker.sh` runs ampe's own worker (`worker/job.json`) the same way: a smoke test of the hosts.{prebuilt}
* `commands.json`: both commands as argument vectors, with their environment.

## Rank → host and device

| rank | stage | replica | shard | host | node | local index | type |
| --- | --- | --- | --- | --- | --- | --- | --- |
{rows}
{multi}{_shares_section(e)}
{_usage(e, profile)}"""


__all__ = ["DEFAULT_MASTER_PORT", "EXPORT_ENV", "ExportOptions", "Exported", "export_plan", "layer_layout", "readme"]
