"""Issue 36's second adversarial pass, part two: scripted cases over what the session's later changes touched —
progress of long commands, plan entries' frozen layers (every scorer against the plan's own figures), uneven shares
in plans and measurements (``replica_gas``), ``trial --emulate-speed`` and the per-replica DeepSpeed configs
``export`` writes (``ds_config_replica<r>.json``). Classified as in ``benchmarks/adversarial_issue36.py`` (refused /
accepted / traceback / wrong); its helpers are reused.

Run: python benchmarks/adversarial_issue36b.py   (about five minutes on two busy cores; totals per class and group,
and every case that is not as expected). On main + harden3: 485 cases, 269 refused, 216 accepted, 0 tracebacks, 0
misjudged (shares in plans 146/34, in measurements 19/5, frozen layers 86/64 and 23 agreements with the plan's own
figures, progress 3/83, --emulate-speed 11/1, ds_config_replica 4/6; refused/accepted).
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adversarial_issue36 import RESULTS, ROOT, cli, print_totals, run

import ampe.cli._progress as progress

PERSEUS = ROOT / "tests" / "data" / "perseus" / "stage_profile" / "bloom+a40_bf16.csv"
CPU_SPEC = ROOT / "cluster_specs" / "local-cpu.yaml"
TINY_LAYERS = 10  # gpt2-tiny


def _search(folder: Path, *extra: str) -> Path:
    """A plan of gpt2-tiny on this machine's two CPU cores (fast to search, export and dry-run)."""
    with contextlib.chdir(folder):
        code, _, err = run(["search", "--cluster", CPU_SPEC, "--model", "gpt2-tiny", "--global-batch", "8",
                            "--top-k", "10", "--out", "plan.json", *extra])
    assert code == 0, err
    return folder / "plan.json"


def _with_entry(plan: Path, name: str, rank: int, **edit: object) -> Path:
    """A copy of ``plan`` holding only its strategy ``rank``, edited (a value ``...`` removes the key)."""
    doc = json.loads(plan.read_text())
    entry = {**next(e for e in doc["strategies"] if e["rank"] == rank)}
    for k, v in edit.items():
        if v is ...:
            entry.pop(k, None)
        else:
            entry[k] = v
    entry["rank"] = 1
    doc["strategies"] = [entry]
    out = plan.parent / name
    out.write_text(json.dumps(doc))
    return out


def _first_dp2(plan: Path) -> int:
    return next(e["rank"] for e in json.loads(plan.read_text())["strategies"] if e["dp"] == 2 and e["mbs"] == 1)


# -- shares in plans ---------------------------------------------------------------------------------------------------

BAD_SHARES: list[tuple[str, object, object]] = [  # (name, replica_gas, gas) — gas follows the largest share
    ("one share for two replicas", [4], 4), ("three shares", [3, 3, 2], 3), ("empty", [], 4),
    ("a zero share", [8, 0], 8), ("a negative share", [9, -1], 9), ("both negative", [-4, -4], 4),
    ("huge", [10**9, 1], 10**9), ("2^63", [2**63, 1], 2**63), ("10^400", [10**400, 1], 10**400),
    ("a float", [4.5, 3.5], 4.5), ("a float that is whole", [5.0, 3.0], 5), ("strings", ["5", "3"], 5),
    ("booleans", [True, True], 1), ("null inside", [5, None], 5), ("nested", [[5], [3]], 5),
    ("an object", {"0": 5, "1": 3}, 5), ("a string", "5:3", 5), ("gas not the largest", [5, 3], 4),
    ("sum mismatching gbs", [5, 4], 5), ("sum short of gbs", [4, 3], 4), ("NaN-like", [float("nan"), 3], 5),
]
GOOD_SHARES: list[tuple[str, list[int], int]] = [("5:3", [5, 3], 8), ("6:2", [6, 2], 8), ("7:1", [7, 1], 8),
                                                  ("3:5", [3, 5], 8), ("5:4 (a batch of 9)", [5, 4], 9)]


def _share_commands(p: Path, tmp: Path, tag: str) -> list[tuple[str, list]]:
    return [("evaluate", ["evaluate", "--cluster", CPU_SPEC, "--model", "gpt2-tiny", "--strategy", p]),
            ("replan --frozen-layers", ["replan", "--plan", p, "--frozen-layers", "1"]),
            ("replan --slow", ["replan", "--plan", p, "--slow", "0=1.2"]),
            ("frontier --plan", ["frontier", "--plan", p, "--out", tmp / f"f-{tag}.json"]),
            ("export", ["export", "--plan", p, "--out", tmp / f"ex-{tag}", "--script", tmp / "train.py"]),
            ("trial --dry-run", ["trial", "--plan", p, "--dry-run", "--out", tmp / f"tr-{tag}"])]


def share_cases(plan: Path, tmp: Path) -> None:
    rank = _first_dp2(plan)
    for k, (name, shares, gas) in enumerate(BAD_SHARES):
        p = _with_entry(plan, f"bad-shares{k}.json", rank, replica_gas=shares, gas=gas, gbs=8)
        for cmd, argv in _share_commands(p, tmp, f"b{k}"):
            cli("shares in plans", f"{name}: {cmd}", argv, "refuse", "NaN" if name.startswith("NaN") else "gas")
    for k, shares in enumerate(([1 << 21, 1 << 21], [1 << 22, 1], [2**40, 2**40 - 1], [10**30, 1])):
        p = _with_entry(plan, f"huge-shares{k}.json", rank, replica_gas=shares, gas=max(shares), gbs=sum(shares))
        doc = json.loads(p.read_text())
        doc["global_batch"] = sum(shares)
        p.write_text(json.dumps(doc))
        for cmd, argv in _share_commands(p, tmp, f"h{k}"):  # a batch consistent with the shares, huge: the
            # largest batch ampe takes is costed (closed form) and exported; its clocks' DAG is refused by the bound
            at_most = shares == [1 << 21, 1 << 21]
            accepted = at_most and cmd not in ("replan --slow", "frontier --plan")
            cli("shares in plans", f"huge and consistent {shares[0]:.3g}: {cmd}", argv,
                "accept" if accepted else "refuse", "nodes" if at_most else "gbs: must be an integer in 1..4194304")
    for k, (name, shares, gbs) in enumerate(GOOD_SHARES):
        p = _with_entry(plan, f"good-shares{k}.json", rank, replica_gas=shares, gas=max(shares), gbs=gbs)
        doc = json.loads(p.read_text())
        doc["global_batch"] = gbs
        doc["strategies"][0].pop("frequency_plan", None)  # its shape was the equal shares'
        p.write_text(json.dumps(doc))
        for cmd, argv in _share_commands(p, tmp, f"g{k}"):
            check = None
            if cmd == "export":
                out = argv[argv.index("--out") + 1]
                check = lambda o=out, s=shares: all((Path(o) / f"ds_config_replica{r}.json").is_file()  # noqa: E731
                                                     for r in range(len(s)))
            cli("shares in plans", f"{name}: {cmd}", argv, "accept", check=check)
    _measured_shares(plan, tmp)


def _measured_shares(plan: Path, tmp: Path) -> None:
    entry = next(e for e in json.loads(plan.read_text())["strategies"] if e["rank"] == _first_dp2(plan))
    base = {k: entry[k] for k in ("pp", "dp", "tp", "mbs", "partition", "placement")}
    for k, (name, shares, _) in enumerate(BAD_SHARES):
        if name.startswith("NaN") or name == "gas not the largest":
            continue  # NaN: a first-pass case (the reader refuses it as a line); a measurement line has no gas
        m = tmp / f"m-bad{k}.jsonl"
        m.write_text(json.dumps({"strategy": {**base, "gbs": 8, "replica_gas": shares}, "status": "ok",
                                 "iteration_s": 0.1}) + "\n")
        cli("shares in measurements", name, ["report", "--measurements", m, "--cluster", CPU_SPEC, "--model",
                                              "gpt2-tiny"], "refuse", "replica_gas")
    for k, (name, shares, gbs) in enumerate(GOOD_SHARES):
        m = tmp / f"m-good{k}.jsonl"
        m.write_text(json.dumps({"strategy": {**base, "gbs": gbs, "replica_gas": shares}, "status": "ok",
                                 "iteration_s": 0.1}) + "\n")
        cli("shares in measurements", name, ["report", "--measurements", m, "--cluster", CPU_SPEC, "--model",
                                              "gpt2-tiny"], "accept")


# -- frozen layers -----------------------------------------------------------------------------------------------------

FROZEN = [0, 1, 2, 5, 9, 10, 11, -1, 1.5, 2.0, "2", True, None, 10**20, 2**63, [2], {"n": 2}, math.inf]


def frozen_cases(frozen_plan: Path, tmp: Path) -> None:
    """Entries of a ``search --frozen-layers 2`` plan with their own ``frozen_layers``: a trial and an export run
    the plan's one prefix (another is refused); every other command costs the entry's."""
    doc = json.loads(frozen_plan.read_text())
    ranks = [e["rank"] for e in doc["strategies"]][:3]
    script = tmp / "train.py"
    for k, value in enumerate(FROZEN):
        ok = value is None or (type(value) is int and 0 <= value <= TINY_LAYERS)
        for rank in ranks[:1] if not ok else ranks[:2]:
            edit = {"frozen_layers": ...} if value is None else {"frozen_layers": value}
            p = _with_entry(frozen_plan, f"frozen{k}-{rank}.json", rank, **edit)
            same = value is None or value == 2
            for cmd, argv, accepted in (
                    ("evaluate", ["evaluate", "--cluster", CPU_SPEC, "--model", "gpt2-tiny", "--strategy", p], ok),
                    ("replan --without", ["replan", "--plan", p, "--without", "1"], ok),
                    ("replan --frozen-layers", ["replan", "--plan", p, "--frozen-layers", "3"], ok),
                    ("frontier", ["frontier", "--plan", p, "--out", tmp / f"fz{k}.json"], ok),
                    ("export", ["export", "--plan", p, "--out", tmp / f"fzx{k}-{rank}", "--script", script],
                     ok and same),
                    ("trial --dry-run", ["trial", "--plan", p, "--dry-run", "--out", tmp / f"fzt{k}-{rank}"],
                     ok and same)):
                cli("frozen layers", f"{value!r:.20} rank {rank}: {cmd}", argv, "accept" if accepted else "refuse",
                    "frozen_layers")
    _frozen_agreement(frozen_plan, tmp)


def _frozen_agreement(frozen_plan: Path, tmp: Path) -> None:
    """Every scorer agrees with the plan's own figures, entry by entry."""
    doc = json.loads(frozen_plan.read_text())
    for e in doc["strategies"]:
        p = _with_entry(frozen_plan, f"agree{e['rank']}.json", e["rank"])
        want = e["predicted"]["iteration_s"]
        out = tmp / f"agree-e{e['rank']}.json"
        cli("frozen layers agree", f"evaluate rank {e['rank']}", ["evaluate", "--cluster", CPU_SPEC, "--model",
            "gpt2-tiny", "--strategy", p, "--json", out], "accept",
            check=lambda o=out, w=want: math.isclose(json.loads(o.read_text())["results"][0]["iteration_s"], w,
                                                     rel_tol=1e-12))
        fp = e.get("frequency_plan")
        if fp:
            fo = tmp / f"agree-f{e['rank']}.json"
            cli("frozen layers agree", f"frontier rank {e['rank']}", ["frontier", "--plan", p, "--out", fo],
                "accept", check=lambda o=fo, w=fp["pipeline_time_s"]: math.isclose(
                    next(x for x in json.loads(o.read_text()) if x["chosen"])["time_s"], w, rel_tol=1e-9))
        keys = ("pp", "dp", "tp", "mbs", "gbs", "partition", "placement", "schedule", "recompute", "stage_recompute",
                "zero", "attention", "dtype", "tf32", "expandable_segments", "replica_gas")
        m = tmp / f"agree-m{e['rank']}.jsonl"
        m.write_text(json.dumps({"strategy": {**{k: e[k] for k in keys if k in e}, "frozen_layers": 2},
                                 "status": "ok", "iteration_s": want}) + "\n")
        r = tmp / f"agree-r{e['rank']}.json"
        cli("frozen layers agree", f"report rank {e['rank']}", ["report", "--measurements", m, "--cluster", CPU_SPEC,
            "--model", "gpt2-tiny", "--json", r], "accept",
            check=lambda o=r, w=want: math.isclose(json.loads(o.read_text())["trials"][0]["predicted_s"], w,
                                                   rel_tol=1e-12))


# -- progress ----------------------------------------------------------------------------------------------------------

def progress_cases(plan: Path, tmp: Path) -> None:
    """Long phases show progress (plain lines here: stderr is not a terminal) and never on stdout; the bounds
    still refuse before any of it."""
    from adversarial_issue36 import run as run_cli

    old = progress.PLAIN_AFTER_S
    progress.PLAIN_AFTER_S = 0.0
    try:
        for m in (1, 2, 3, 4, 6, 8, 12):
            for unit in ("0.001", "0.002", "0.0005"):
                for extra in ([], ["--resolution", "50"], ["--no-polish"]):
                    argv = ["frontier", "--profile", PERSEUS, "--stages", "8", "--microbatches", m, "--unit-time",
                            unit, "--out", tmp / "pf.json", *extra]
                    _progress_case(f"frontier --profile m{m} τ{unit} {' '.join(extra)}", argv, run_cli,
                                   ["ampe frontier: tracing ", "ampe frontier: realizing "])
        for rank in range(1, 11):
            argv = ["frontier", "--plan", plan, "--rank", rank, "--out", tmp / "pp.json"]
            _progress_case(f"frontier --plan rank {rank}", argv, run_cli, ["ampe frontier: tracing and realizing"])
        for bad in (["--unit-time", "1e-9"], ["--resolution", "0", "--unit-time", "1e-7"], ["--microbatches", 10**7]):
            argv = ["frontier", "--profile", PERSEUS, "--stages", "8", "--microbatches", 12, "--out", tmp / "pb.json"]
            argv = [*argv[:6], str(bad[-1]), *argv[7:]] if bad[0] == "--microbatches" else argv + bad
            cli("progress", f"bounded first: frontier {' '.join(map(str, bad))}", argv, "refuse", "")
        _calibration_progress(plan, tmp, run_cli)
    finally:
        progress.PLAIN_AFTER_S = old


def _progress_case(name: str, argv: list, run_cli, prefixes: list[str]) -> None:
    code, out, err = run_cli(argv)
    if code is None or "Traceback" in err:
        RESULTS.append(("progress", name, "traceback", err.strip().splitlines()[-1][:200] if err.strip() else ""))
        return
    shown = all(any(ln.startswith(p) for ln in err.splitlines()) for p in prefixes)
    ok = code == 0 and shown and not any(p.strip() in out for p in prefixes)
    RESULTS.append(("progress", name, "accepted" if ok else "wrong", f"code {code}: {err[-200:]}"))


def _calibration_progress(plan: Path, tmp: Path, run_cli) -> None:
    doc = json.loads(plan.read_text())
    keys = ("pp", "dp", "tp", "mbs", "gbs", "partition", "placement", "schedule", "recompute", "zero", "attention",
            "dtype", "tf32", "expandable_segments")
    lines = [json.dumps({"strategy": {k: e[k] for k in keys if k in e}, "status": "ok",
                         "iteration_s": e["predicted"]["iteration_s"] * (1.1 + 0.03 * i)})
             for i, e in enumerate(doc["strategies"])]
    for n in range(1, len(lines) + 1):
        m = tmp / f"cal{n}.jsonl"
        m.write_text("\n".join(lines[:n]) + "\n")
        code, out, err = run_cli(["report", "--measurements", m, "--cluster", CPU_SPEC, "--model", "gpt2-tiny",
                                  "--calibrate", tmp / f"cal{n}.csv"])
        if code is None or "Traceback" in err:
            RESULTS.append(("progress", f"calibrate {n}", "traceback", err.strip().splitlines()[-1][:200]))
            continue
        shown = [ln for ln in err.splitlines() if ln.startswith("ampe report: calibrating ")]
        ok = code == 0 and (bool(shown) == (n >= 4)) and "calibrating" not in out  # < 4: one factor, no selection
        RESULTS.append(("progress", f"report --calibrate, {n} strategies", "accepted" if ok else "wrong",
                        f"code {code}: {err[-200:]}"))


# -- trial --emulate-speed and export's per-replica configs ------------------------------------------------------------

def emulate_cases(plan: Path, gpu_plan: Path, tmp: Path) -> None:
    cli("--emulate-speed", "on CPU ranks", ["trial", "--plan", plan, "--dry-run", "--emulate-speed", "--out",
                                            tmp / "em0"], "accept")
    cli("--emulate-speed", "on GPUs", ["trial", "--plan", gpu_plan, "--dry-run", "--emulate-speed", "--out",
                                       tmp / "em1"], "refuse", "--emulate-speed")
    for k, value in enumerate(("2", "0", "-1", "inf", "nan", "", "1e400", "yes", "true", "²")):
        cli("--emulate-speed", f"--emulate-speed={value}", ["trial", "--plan", plan, "--dry-run",
                                                            f"--emulate-speed={value}", "--out", tmp / f"em{k + 2}"],
            "refuse", "--emulate-speed")


def replica_config_cases(plan: Path, tmp: Path) -> None:
    """``export`` of uneven shares writes ``ds_config_replica<r>.json``: never through a planted link, never onto
    an input, never beside stale configs of another export."""
    rank = _first_dp2(plan)
    p = _with_entry(plan, "uneven-export.json", rank, replica_gas=[5, 3], gas=5, gbs=8, frequency_plan=...)
    victim = tmp / "victim.json"
    victim.write_text("precious\n")

    def export(plan_file: Path, out: Path) -> list:
        return ["export", "--plan", plan_file, "--out", out, "--script", tmp / "train.py"]

    for k in range(4):  # a link planted where each config would go (and one beyond the replicas)
        out = tmp / f"rc-link{k}"
        out.mkdir()
        (out / f"ds_config_replica{k}.json").symlink_to(victim)
        cli("ds_config_replica", f"link planted at replica {k}", export(p, out), "refuse" if k < 2 else "accept",
            LINK_WORDS, tmp if k < 2 else None,  # beyond the replicas: an earlier export's, unlinked (not followed)
            check=lambda o=out, k=k: victim.read_text() == "precious\n" and not (o / f"ds_config_replica{k}.json")
            .is_symlink())
    inside = tmp / "rc-in"
    inside.mkdir()
    for k in range(2):
        q = inside / f"ds_config_replica{k}.json"
        shutil.copy(p, q)
        cli("ds_config_replica", f"the plan is the folder's replica {k} config", export(q, inside), "refuse",
            INPUT_WORDS, inside)
        q.unlink()
    out = tmp / "rc-twice"
    for k in range(3):  # exported again: the same files, each config whole
        cli("ds_config_replica", f"export again #{k}", export(p, out), "accept",
            check=lambda o=out: [json.loads((o / f"ds_config_replica{r}.json").read_text())[
                "gradient_accumulation_steps"] for r in range(2)] == [5, 3])
    even = _with_entry(plan, "even-export.json", rank)
    cli("ds_config_replica", "equal shares after uneven: stale replica configs", export(even, out), "accept",
        check=lambda: not any(out.glob("ds_config_replica*.json")))


LINK_WORDS = "is a symbolic link; ampe neither writes through nor replaces one"
INPUT_WORDS = "is also the input --plan"


def main_pass() -> int:
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        (tmp / "plain").mkdir()
        (tmp / "train.py").write_text("print('a training script')\n")  # what export's launch line names
        (tmp / "frozen").mkdir()
        plan = _search(tmp / "plain")
        frozen = _search(tmp / "frozen", "--frozen-layers", "2")
        gpu = tmp / "gpu"
        gpu.mkdir()
        with contextlib.chdir(gpu):
            code, _, err = run(["search", "--cluster", ROOT / "cluster_specs" / "amp-het-cluster.yaml", "--model",
                                "gpt2-amp", "--global-batch", "32", "--top-k", "1", "--energy-planner", "none",
                                "--out", "plan.json"])
        assert code == 0, err
        with contextlib.chdir(tmp):
            share_cases(plan, tmp)
            frozen_cases(frozen, tmp)
            progress_cases(plan, tmp)
            emulate_cases(plan, gpu / "plan.json", tmp)
            replica_config_cases(plan, tmp)
    return print_totals()


if __name__ == "__main__":
    sys.exit(main_pass())
