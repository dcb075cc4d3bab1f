"""Issue 36's second adversarial pass: scripted cases over what its hardening changed, run in-process (``ampe`` as
``ampe.cli.main``, or the library function a spec reaches), each classified as

* ``refused``: exit status 2 (or an InputError from the library), one line, no traceback, inputs unchanged, where a
  refusal is expected;
* ``accepted``: exit status 0 where acceptance is expected (and the check the case names holds);
* ``traceback``: an exception other than InputError escaped;
* ``wrong``: refused where it should be accepted, accepted where it should be refused, several lines, an input
  changed, or a case's own check failed.

Run: python benchmarks/adversarial_issue36.py   (a few minutes on two busy cores; prints totals per class and group,
and every case that is not as expected)
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("COLUMNS", "200")

from ampe.cli import main
from ampe.cli._paths import COMMANDS, FOLDER, PICTURE
from ampe.errors import InputError

PERSEUS = ROOT / "tests" / "data" / "perseus" / "stage_profile" / "gpt3-175b+a40_bf16.csv"
RESULTS: list[tuple[str, str, str, str]] = []  # (group, case, class, detail)


def digest(folder: Path) -> dict[str, str]:
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def run(argv: list) -> tuple[int | None, str, str]:
    """(exit status, stdout, stderr) of ``ampe argv`` in-process; status None and the traceback when it raised."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in argv])
    except SystemExit as e:
        code = int(e.code or 0)
    except BaseException:
        return None, out.getvalue(), traceback.format_exc()
    return code, out.getvalue(), err.getvalue()


def cli(group: str, name: str, argv: list, expect: str, words: str = "", watch: Path | None = None,
        check: Callable[[], bool] | None = None) -> None:
    """Run one CLI case and classify it (``expect``: "refuse" or "accept"; ``words``: in the refusal line)."""
    before = digest(watch) if watch is not None else None
    code, _, err = run(argv)
    changed = watch is not None and expect == "refuse" and digest(watch) != before
    if code is None or "Traceback" in err:
        RESULTS.append((group, name, "traceback", err.strip().splitlines()[-1][:200] if err.strip() else ""))
    elif expect == "refuse":
        lines = err.strip().splitlines()
        ok = code == 2 and len(lines) == 1 and words in err and not changed
        RESULTS.append((group, name, "refused" if ok else "wrong", f"code {code}, changed {changed}: {err[-200:]}"))
    else:
        ok = code == 0 and (check is None or check())
        RESULTS.append((group, name, "accepted" if ok else "wrong", f"code {code}: {err.strip()[-200:]}"))


def lib(group: str, name: str, call: Callable[[], object], expect: str, words: str = "") -> None:
    """A library case: InputError is a refusal, a return an acceptance."""
    try:
        call()
    except InputError as e:
        ok = expect == "refuse" and words in str(e) and "\n" not in str(e)
        RESULTS.append((group, name, "refused" if ok else "wrong", str(e)[:200]))
        return
    except BaseException:
        RESULTS.append((group, name, "traceback", traceback.format_exc().strip().splitlines()[-1][:200]))
        return
    RESULTS.append((group, name, "accepted" if expect == "accept" else "wrong", ""))


# -- 1. outputs that name inputs ---------------------------------------------------------------------------------------

def path_cases(tmp: Path) -> None:
    """Every (input, output) pair of every command, through five spellings of one file."""
    from tests.test_cli_paths import PREFIX, _leaf, _required, _words

    for command, paths in COMMANDS.items():
        parser = _leaf(command)
        for inp in paths.inputs:
            for out in paths.outputs:
                for how in ("same", "dot", "absolute", "symlink", "hardlink", "parent"):
                    if FOLDER in (inp.kind, out.kind) and how in ("symlink", "hardlink"):
                        continue
                    if inp.kind == FOLDER and out.kind == PICTURE:
                        continue
                    work = tmp / f"p-{command}-{inp.attr}-{out.attr}-{how}"
                    (work / "sub").mkdir(parents=True)
                    name = "same.png" if out.kind == PICTURE else "same.json"
                    shared = work / name
                    in_value = out_value = str(shared)
                    if out.kind == FOLDER:
                        out_value = str(work / "od")
                        inner = out.within[0] + ("x.json" if out.within[0].endswith("/") else "")
                        shared = work / "od" / inner
                        in_value = str(shared)
                    if inp.kind == FOLDER:
                        in_value = str(work / "id")
                        shared = work / "id" / inp.within[0]
                        out_value = str(shared)
                    shared.parent.mkdir(parents=True, exist_ok=True)
                    shared.write_text("precious\n")
                    target = out_value if inp.kind == FOLDER else in_value
                    spelled = {"same": target, "dot": str(Path(target).parent / "." / Path(target).name),
                               "absolute": os.path.abspath(target),
                               "parent": str(Path(target).parent / "sub" / ".." / Path(target).name)}
                    if how in ("symlink", "hardlink"):
                        other = work / ("other" + shared.suffix)
                        (other.symlink_to if how == "symlink" else other.hardlink_to)(shared)
                        if how == "symlink":
                            in_value = str(other)  # the input through a link, the output the file itself
                        else:
                            out_value = str(other)
                    elif inp.kind == FOLDER:
                        out_value = spelled[how]
                    else:
                        out_value = spelled[how] if out.kind != FOLDER else out_value
                    argv = [*PREFIX.get(command, [command]), *_required(parser, {inp.attr, out.attr}),
                            *_words(parser, inp, in_value), *_words(parser, out, out_value)]
                    cli("outputs vs inputs", f"{command} {inp.flag}->{out.flag} {how}", argv, "refuse", "", work)


def plan_path_cases(plan: Path) -> None:
    """Outputs onto the plan's own inputs (known only once the plan is read)."""
    a = plan.parent.parent
    for argv in (["frontier", "--plan", plan, "--out", a / "het.yaml"],
                 ["frontier", "--plan", plan, "--out", "f.json", "--export-profile", a / "prof.csv"],
                 ["replan", "--plan", plan, "--frozen-layers", "1", "--out", a / "prof.csv"],
                 ["replan", "--plan", plan, "--without", "0", "--out", "n.json", "--cluster-out", a / "het.yaml"],
                 ["replan", "--plan", plan, "--without", "0", "--out", a / "plans" / "plan.json"],
                 ["replan", "--plan", plan, "--without", "0", "--out", a / "prof.json", "--cluster-out",
                  a / "prof.csv"]):
        cli("outputs vs a plan's inputs", " ".join(map(str, argv[2:]))[-80:], argv, "refuse", "", a)


# -- 2. ids and indices ------------------------------------------------------------------------------------------------

ODD = ["²", "٣", "９", "1" * 5000, "9" * 4301, "-1", "+1", "1e3", "0x1", "1_0", "1 2", "", "1.0", "١٢",
       "99999999999", "4294967296", "𝟙"]


def index_cases(plan: Path) -> None:
    from ampe.costmodel.cluster import cluster_from_dict

    spec = {"name": "c", "nodes": [{"name": "a", "gpu": "A100-80GB", "count": 2, "intra_gbps": 100,
                                    "inter_gbps": 10, "repeat": 2}]}
    for odd in ODD:
        for flag, value in (("--without", odd), ("--without", f"p3-0:{odd}"), ("--slow", f"{odd}=2"),
                            ("--slow", f"p3-0:{odd}=2")):
            if value.strip() in ("", "=2") and flag == "--without":
                continue
            cli("ids and indices", f"{flag} {value[:20]!r}", ["replan", "--plan", plan, flag, value], "refuse")
        lib("ids and indices", f"down a-0:{odd[:20]!r}",
            lambda o=odd: cluster_from_dict({**spec, "down": [f"a-0:{o}"]}), "refuse")
        lib("ids and indices", f"stragglers a-0:{odd[:20]!r}",
            lambda o=odd: cluster_from_dict({**spec, "stragglers": {f"a-0:{o}": 2}}), "refuse")
    lib("ids and indices", "down a-0:007 (device 7 of a node of two)",
        lambda: cluster_from_dict({**spec, "down": ["a-0:007"]}), "refuse")
    for good in ("0", "1", "00", "01"):
        lib("ids and indices", f"down a-0:{good}", lambda g=good: cluster_from_dict({**spec, "down": [f"a-0:{g}"]}),
            "accept")
    for flag, value in (("--without", " 1"), ("--without", "1 "), ("--slow", " 1=2"), ("--slow", "p3-0:1 =2"),
                        ("--without", "007"), ("--slow", "007=2")):  # device 7 of the plan's 16
        cli("ids and indices", f"{flag} {value!r} (list items are trimmed)", ["replan", "--plan", plan, flag, value],
            "accept")


# -- 3. bounded work ---------------------------------------------------------------------------------------------------

def bounded_cases(tmp: Path) -> None:
    from ampe.cli._common import usable_cores

    cores = usable_cores()
    spec = ROOT / "cluster_specs" / "local-cpu.yaml"
    for jobs, expect in ((cores + 1, "refuse"), (100000, "refuse"), (10**9, "refuse"), (2**40, "refuse")):
        cli("bounded work", f"search --jobs {jobs}", ["search", "--cluster", spec, "--model", "gpt2-tiny", "--jobs",
                                                     jobs], expect, "--jobs")
    for jobs in ("0", "-1", "1e3", "x", "1" * 30):
        cli("bounded work", f"search --jobs {jobs[:10]}", ["search", "--cluster", spec, "--model", "gpt2-tiny",
                                                          "--jobs", jobs], "refuse", "--jobs")
    cli("bounded work", "search --jobs 10 with a scheduler address",
        ["search", "--cluster", spec, "--model", "nosuch", "--jobs", "10", "--joblib-backend", "dask", "--scheduler",
         "tcp://127.0.0.1:1"], "refuse", "--model")  # the cap passes remote workers; the model is refused next
    for mb, unit, res, expect in ((12, "1e-6", "0", "refuse"), (48, "1e-6", "0", "refuse"),
                                  (48, "1e-5", "0", "refuse"), (12, "1e-6", "2000000", "refuse"),
                                  (4, "1e-3", "0", "accept"), (4, "1e-4", "0", "accept"),
                                  (12, "1e-6", None, "accept")):
        argv = ["frontier", "--profile", PERSEUS, "--stages", "8", "--microbatches", mb, "--unit-time", unit,
                "--out", tmp / "f.json"] + (["--resolution", res] if res is not None else [])
        cli("bounded work", f"frontier mb {mb} unit {unit} resolution {res}", argv, expect, "--resolution")
    from ampe.report.calibrate import MAX_SELECTION_STRATEGIES, selection_sample

    for n in (0, 1, 2, 39, 40, 41, 100, 400, 10000):
        lib("bounded work", f"calibration sample of {n}", lambda n=n: _sample_ok(selection_sample, n,
                                                                                 MAX_SELECTION_STRATEGIES), "accept")


def _sample_ok(sample: Callable, n: int, most: int) -> None:
    picked = sample([float(i % 97) for i in range(n)])
    if len(picked) != min(n, most) or len(set(picked)) != len(picked):
        raise AssertionError(f"{len(picked)} picked of {n}")


# -- 4. a plan's inputs ------------------------------------------------------------------------------------------------

def plan_cases(plan: Path, tmp: Path) -> None:
    a = plan.parent.parent
    other = tmp / "elsewhere"
    other.mkdir()
    (other / "het.yaml").write_text("name: decoy\n")
    (other / "prof.csv").write_text("decoy\n")
    for argv in (["replan", "--plan", plan, "--frozen-layers", "1"], ["frontier", "--plan", plan, "--out",
                                                                     other / "f.json"],
                 ["trial", "--plan", plan, "--dry-run", "--out", other / "runs"]):
        with contextlib.chdir(other):
            cli("a plan's inputs", f"{argv[0]} from a folder of decoys", argv, "accept")
    moved = tmp / "moved"
    shutil.copytree(a, moved)
    cli("a plan's inputs", "plan moved with its inputs", ["replan", "--plan", moved / "plans" / "plan.json",
                                                          "--frozen-layers", "1"], "accept")
    for what, edit in (("links 1000x slower", lambda t: t.replace("inter_gbps: 10", "inter_gbps: 0.01")),
                       ("a straggler added", lambda t: t + "stragglers: {p3-0: 2}\n"),
                       ("prices added", lambda t: t + "currency: USD\nelectricity_per_kwh: 0.1\n"),
                       ("a comment added", lambda t: t + "# a comment\n")):
        work = tmp / f"changed-{what.replace(' ', '-')}"
        shutil.copytree(a, work)
        spec = work / "het.yaml"
        spec.write_text(edit(spec.read_text()))
        for argv in (["replan", "--plan", work / "plans" / "plan.json", "--frozen-layers", "1"],
                     ["frontier", "--plan", work / "plans" / "plan.json", "--out", work / "f.json"],
                     ["export", "--plan", work / "plans" / "plan.json", "--out", work / "exp"],
                     ["replan", "--plan", work / "plans" / "plan.json", "--without", "0"]):
            cli("a plan's inputs", f"spec changed ({what}): {argv[0]} {argv[3]}", argv, "refuse",
                "changed since the plan was made")
    work = tmp / "profile-changed"
    shutil.copytree(a, work)
    (work / "prof.csv").write_text((work / "prof.csv").read_text() + "\n")
    cli("a plan's inputs", "profile changed", ["replan", "--plan", work / "plans" / "plan.json", "--frozen-layers",
                                               "1"], "refuse", "inputs.profile")
    out = tmp / "deep" / "er"
    out.mkdir(parents=True)
    cli("a plan's inputs", "re-plan written elsewhere", ["replan", "--plan", plan, "--frozen-layers", "1", "--out",
                                                         out / "re.json"], "accept",
        check=lambda: (out / json.loads((out / "re.json").read_text())["inputs"]["profile"]).resolve()
        == (a / "prof.csv").resolve())
    cli("a plan's inputs", "re-plan of the re-plan", ["replan", "--plan", out / "re.json", "--frozen-layers", "2"],
        "accept")


# -- 5. names, configs, fits, exports, frontier options, plan entries --------------------------------------------------

NODE_NAMES = ["a:1", "a,b", "a=b", "a b", "a\nb", "a\tb", "a\x1b[31m", "\x1b]0;x\x07", "a\x00", " a", "a ", "a\r",
              "a\u200b", "a\u2028b", "a\x7f"]


def name_cases() -> None:
    from ampe.costmodel.cluster import cluster_from_dict
    from ampe.costmodel.zoo import model_from_dict

    node = {"name": "a", "gpu": "A100-80GB", "count": 2, "intra_gbps": 100, "inter_gbps": 10}
    for n in NODE_NAMES:
        lib("names", f"node {n!r}", lambda n=n: cluster_from_dict({"name": "c", "nodes": [{**node, "name": n}]}),
            "refuse", "name")
    for n in ("a\x1b[2J", "c\nd", "\x07", " USD", "US\x00D"):
        lib("names", f"currency {n!r}", lambda n=n: cluster_from_dict({"name": "c", "nodes": [node], "currency": n}),
            "refuse", "currency")
        lib("names", f"cluster name {n!r}", lambda n=n: cluster_from_dict({"name": n, "nodes": [node]}), "refuse",
            "name")
        lib("names", f"model name {n!r}", lambda n=n: model_from_dict({"name": n, "base": "gpt2-tiny"}, "m.yaml"),
            "refuse", "name")
    for n in ("rack_1.p3", "gpu-node-7", "n.1+2", "Ünïcode", "节点"):
        lib("names", f"node {n!r} kept", lambda n=n: cluster_from_dict({"name": "c", "nodes": [{**node, "name": n}]}),
            "accept")
    for n in ("€", "USD", "CHF", "元"):
        lib("names", f"currency {n!r} kept",
            lambda n=n: cluster_from_dict({"name": "c", "nodes": [node], "currency": n}), "accept")


MISTRAL = {"model_type": "mistral", "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
           "num_hidden_layers": 2, "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 2048,
           "sliding_window": 1024, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def hf_cases() -> None:
    from ampe.costmodel.hf_config import model_from_hf_config

    bad = [{"tie_word_embeddings": v} for v in ("false", "true", 0, 1, "", [], {}, 0.0)]
    bad += [{"attention_bias": v} for v in ("no", 1, "False")]
    bad += [{"sliding_window": v} for v in (1024.0, "1024", True, -1, 0, 10**12, [1024], 1.5)]
    bad += [{"torch_dtype": v} for v in ("float64", "int8", "fp16", "bf16", "BFLOAT16", "", None, 16, "float8_e4m3fn",
                                         "complex64")]
    bad += [{"model_type": "qwen2", "use_sliding_window": v} for v in ("yes", 1, "true")]
    bad += [{"model_type": "llama", "use_sliding_window": True, "sliding_window": v} for v in ("x", 2.5)]
    bad += [{"_name_or_path": v} for v in ("org/a\x1b[31m", "a,b", "x\ny")]
    for change in bad:
        lib("Hugging Face configs", f"{change}"[:60], lambda c=change: model_from_hf_config({**MISTRAL, **c}, "c.json"),
            "refuse")
    good = [{}, {"sliding_window": None}, {"tie_word_embeddings": True}, {"torch_dtype": "float32"},
            {"torch_dtype": "float16"}, {"model_type": "qwen2", "use_sliding_window": False, "sliding_window": 7.5},
            {"model_type": "llama", "sliding_window": "ignored"}, {"attention_bias": None}]
    for change in good:
        lib("Hugging Face configs", f"{change} kept"[:60],
            lambda c=change: model_from_hf_config({**MISTRAL, **c}, "c.json"), "accept")


def dvfs_cases(tmp: Path) -> None:
    rows = PERSEUS.read_text().splitlines()

    def scaled(name: str, t: float, e: float) -> Path:
        p = tmp / name
        p.write_text("\n".join([rows[0]] + [",".join([*r.split(",")[:3], repr(float(r.split(",")[3]) * t),
                                                       repr(float(r.split(",")[4]) * e)]) for r in rows[1:]]) + "\n")
        return p

    for t, e in ((1e308, 1), (1, 1e308), (1, 1e-3), (1, 1e-300), (1e-300, 1), (1, 1e3), (1, 1e6)):
        out = tmp / f"o-{t}-{e}.yaml"
        cli("dvfs fit", f"times ×{t:g} energies ×{e:g}", ["dvfs", "fit", "--profile", scaled(f"s-{t}-{e}.csv", t, e),
                                                         "--gpu", "A40", "--out", out], "refuse", "", None,
            None)
        if out.exists():
            RESULTS[-1] = ("dvfs fit", RESULTS[-1][1], "wrong", "wrote a block")
    for gpus in ("100000", "4096"):
        cli("dvfs fit", f"--gpus {gpus}", ["dvfs", "fit", "--profile", PERSEUS, "--gpu", "A40", "--gpus", gpus,
                                           "--out", tmp / "g.yaml"], "refuse")
    for t, e in ((1e-300, 1e-300), (1e300, 1e300), (1, 1), (2, 2)):
        cli("dvfs fit", f"times ×{t:g} energies ×{e:g} (same power)",
            ["dvfs", "fit", "--profile", scaled(f"k-{t}-{e}.csv", t, e), "--gpu", "A40", "--out", tmp / f"k{t}.yaml"],
            "accept")


def frontier_cases(tmp: Path) -> None:
    base = ["frontier", "--profile", PERSEUS, "--stages", "8", "--microbatches", "4", "--out", tmp / "f.json"]
    for unit in ("10", "1", "0.2", "0.12"):
        cli("frontier options", f"--floor-times --unit-time {unit}", [*base, "--floor-times", "--unit-time", unit],
            "refuse", "--unit-time")
    for watts in ("302", "500", "2000", "3000"):
        cli("frontier options", f"--p2p-power {watts}", [*base, "--p2p-power", watts], "refuse", "--p2p-power")
    for extra in (["--floor-times", "--unit-time", "0.1"], ["--p2p-power", "0"], ["--p2p-power", "250"]):
        cli("frontier options", " ".join(extra) + " kept", [*base, *extra], "accept")


def hostname_cases(plan: Path, tmp: Path) -> None:
    from ampe.trials.hostfile import _HOSTNAME

    for name, ok in (("a" * 300, False), ("a" * 64, False), ("a" * 63, True), (".".join(["a" * 63] * 4), False),
                     (".".join(["a" * 50] * 4), True), ("a..b", False), ("-", True), ("10.0.0.1", True),
                     ("node-1.cluster.local", True), ("a b", False), ("a;b", False), ("$(x)", False),
                     ("a\nb", False), ("", False)):
        lib("host names", f"{name[:30]!r}", lambda n=name, ok=ok: _check_host(_HOSTNAME, n, ok), "accept")


def _check_host(pattern, name: str, ok: bool) -> None:
    if bool(pattern.match(name)) != ok:
        raise AssertionError(f"{name!r}: matched {not ok}")


def export_cases(plan: Path, tmp: Path) -> None:
    specs = ROOT / "cluster_specs"
    # amp-homogeneous is T4s only: a type the plan was made for (accepted); the plan's placement is not one the
    # DeepSpeed launcher can run (ranks of a node not contiguous), so the accepted cases run `trial --dry-run` only
    for spec, expect in ((specs / "local-cpu.yaml", "refuse"), (specs / "mixed-a100-a40.yaml", "refuse"),
                         (specs / "perseus-a40-8.yaml", "refuse"), (specs / "amp-homogeneous.yaml", "accept"),
                         (specs / "amp-het-cluster.yaml", "accept")):
        for command in ("export", "trial") if expect == "refuse" else ("trial",):
            argv = [command, "--plan", plan, "--cluster", spec, "--out", tmp / f"{command}-{spec.stem}"]
            if command == "trial":
                argv.append("--dry-run")
            cli("export --cluster", f"{command} --cluster {spec.stem}", argv, expect, "--cluster")
    cpu_plan = tmp / "cpu" / "plan.json"
    cpu_plan.parent.mkdir()
    code, _, err = run(["search", "--cluster", specs / "local-cpu.yaml", "--model", "gpt2-tiny", "--global-batch", "4",
                        "--top-k", "1", "--out", cpu_plan])
    assert code == 0, err
    for command in ("export", "trial"):
        argv = [command, "--plan", cpu_plan, "--freq-backend", "nvml", "--out", tmp / f"nv-{command}"]
        cli("export --cluster", f"{command} --freq-backend nvml on a CPU plan", argv + (["--dry-run"] if command ==
                                                                                       "trial" else []),
            "refuse", "--freq-backend")


def entry_cases(plan: Path, tmp: Path) -> None:
    doc = json.loads(plan.read_text())
    entry = doc["strategies"][0]
    steps = lambda mhz: [[k, m, mhz] for k in ("forward", "backward") for m in range(entry["gas"])]  # noqa: E731
    edits = [({"frozen_layers": v}, "frozen_layers") for v in (31, 99, 10**6)]  # gpt2-amp: 30 layers
    edits += [({"frequency_plan": {"stages": [steps(mhz)] * entry["pp"]}}, "frequency_plan")
              for mhz in (9000, 1531, 134, 1, 100000)]
    for k, (edit, words) in enumerate(edits):
        p = plan.parent / f"edited{k}.json"
        p.write_text(json.dumps({**doc, "strategies": [{**entry, **edit}]}))
        for argv in (["replan", "--plan", p, "--frozen-layers", "1"], ["export", "--plan", p, "--out", tmp / "ex"],
                     ["frontier", "--plan", p, "--out", tmp / "fe.json"]):
            if "frozen_layers" in edit and argv[0] == "frontier":
                continue
            cli("plan entries", f"{edit}"[:50] + f" {argv[0]}", argv, "refuse", words)
    for mhz in (135, 1530, 1000):
        p = plan.parent / f"ok{mhz}.json"
        p.write_text(json.dumps({**doc, "strategies": [{**entry, "frequency_plan": {"stages": [steps(mhz)] *
                                                                                    entry["pp"]}}]}))
        cli("plan entries", f"clock {mhz} MHz on V100/T4", ["trial", "--plan", p, "--dry-run", "--out",
                                                            tmp / f"ok{mhz}"], "accept" if 300 <= mhz <= 1530 else
            "refuse")


def replan_cases(plan: Path, tmp: Path) -> None:
    frag = tmp / "frag.yaml"
    frag.write_text("nodes: [{name: q, gpu: V100-16GB, count: 4, intra_gbps: 170, inter_gbps: 10}]\n"
                    "gpu_types: {V100-16GB: {base: V100-16GB, peak_tflops_fp16: 1}}\n")
    cli("replan", "--add redefining a type in use", ["replan", "--plan", plan, "--add", frag], "refuse", "gpu_types")
    cli("replan", "--cluster-out without --out", ["replan", "--plan", plan, "--without", "0", "--cluster-out",
                                                  tmp / "c.yaml"], "refuse", "only with --out")
    from ampe.costmodel.cluster import cluster_from_dict

    spec = {"name": "c", "nodes": [{"name": "a", "gpu": "A100-80GB", "count": 2, "intra_gbps": 100,
                                    "inter_gbps": 10, "repeat": 2}]}
    for stragglers in ({"a-0": 2, "a-0:1": 3}, {"a-0:1": 2, "a-0:01": 3}, {"a-0:0": 2, "a-0:00": 2},
                       {"a-1": 2, "a-1:0": 1}):
        lib("replan", f"stragglers {stragglers}", lambda s=stragglers: cluster_from_dict({**spec, "stragglers": s}),
            "refuse", "named twice")
    from ampe.costmodel.cluster_change import ClusterChange, changed_spec

    slow = {**spec, "stragglers": {"a-0": 2.0}}
    c = cluster_from_dict(slow)
    for change, want in (((("a-0:0", 1.0),), [1, 2, 1, 1]), ((("a-0:1", 1.0),), [2, 1, 1, 1]),
                         ((("a-0", 1.0),), [1, 1, 1, 1]), ((("0", 1.0),), [1, 2, 1, 1]),
                         ((("a-0:0", 3.0),), [3, 2, 1, 1]), ((("a-0", 3.0), ("a-0:1", 1.0)), [3, 1, 1, 1])):
        lib("replan", f"--slow {change} on a slow node",
            lambda ch=change, w=want: _slowdowns(cluster_from_dict(changed_spec(slow, c, ClusterChange(slow=ch))), w),
            "accept")


def _slowdowns(cluster, want: list[int]) -> None:
    have = [d.gpu.slowdown for d in cluster.devices]
    if have != want:
        raise AssertionError(f"{have} != {want}")


def main_pass() -> int:
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        a = tmp / "a"
        (a / "plans").mkdir(parents=True)
        shutil.copy(ROOT / "cluster_specs" / "amp-het-cluster.yaml", a / "het.yaml")
        shutil.copy(ROOT / "ampe" / "data" / "amp_layer_profiles.csv", a / "prof.csv")
        with contextlib.chdir(a):
            code, _, err = run(["search", "--cluster", "het.yaml", "--model", "gpt2-amp", "--profile", "prof.csv",
                                "--global-batch", "32", "--top-k", "1", "--energy-planner", "none", "--out",
                                "plans/plan.json"])
        assert code == 0, err
        plan = a / "plans" / "plan.json"
        with contextlib.chdir(tmp):
            path_cases(tmp / "paths")
            plan_path_cases(plan)
            index_cases(plan)
            bounded_cases(tmp)
            plan_cases(plan, tmp)
            name_cases()
            hf_cases()
            dvfs_cases(tmp)
            frontier_cases(tmp)
            hostname_cases(plan, tmp)
            export_cases(plan, tmp)
            entry_cases(plan, tmp)
            replan_cases(plan, tmp)
    return print_totals()


def print_totals() -> int:
    """Totals per class and per group, then every case that is not as expected; 0."""
    totals = Counter(c for _, _, c, _ in RESULTS)
    print(f"{len(RESULTS)} cases: " + ", ".join(f"{k} {totals[k]}" for k in ("refused", "accepted", "traceback",
                                                                              "wrong")))
    for group in dict.fromkeys(g for g, _, _, _ in RESULTS):
        per = Counter(c for g, _, c, _ in RESULTS if g == group)
        print(f"  {group}: " + ", ".join(f"{k} {v}" for k, v in sorted(per.items())))
    for group, name, cls, detail in RESULTS:
        if cls in ("traceback", "wrong"):
            print(f"{cls.upper()}: [{group}] {name}: {detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main_pass())
