"""``ampe --help`` and a subcommand's ``--help`` import only what they need (start-up costs about a bare Python)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("numpy", "scipy", "pydantic", "matplotlib", "yaml", "joblib")


def _modules_after(*argv: str) -> set[str]:
    code = ("import sys\nfrom ampe.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print(' '.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True).stdout
    return set(out.strip().splitlines()[-1].split())


def test_top_level_help_imports_no_subcommand_module():
    loaded = _modules_after("--help")
    assert not [m for m in HEAVY if m in loaded]
    assert not [m for m in loaded if m.startswith("ampe.cli.") and not m.startswith("ampe.cli._")]
    bare = _modules_after("--version")  # the interpreter's own start-up (site hooks may load ast, e.g. coverage)
    assert "ast" not in loaded - bare  # the subcommands' one-line help is read without parsing their modules


def test_subcommand_help_imports_only_that_subcommand():
    loaded = _modules_after("frontier", "--help")
    assert "ampe.cli.frontier" in loaded
    assert not {"ampe.cli.search", "ampe.cli.trial", "ampe.cli.report"} & loaded


def test_every_subcommand_is_listed():
    from ampe.cli import build_parser

    lazy = build_parser(None)
    full = build_parser()
    names = [next(a for a in p._actions if a.dest == "command").choices for p in (lazy, full)]
    assert list(names[0]) == list(names[1]) and len(names[0]) >= 7
    helps = [{c.dest: c.help for c in next(a for a in p._actions if a.dest == "command")._choices_actions}
             for p in (lazy, full)]
    assert helps[0] == helps[1]  # the stubs' one-line help is the registered one


def test_small_profile_frontier_imports_no_scipy(tmp_path):
    """``ampe frontier --profile`` on a small pipeline runs on numpy alone: its min cuts use the pure-Python max flow
    and nothing it reads is YAML (start-up is most of its run time, docs/energy.md §8)."""
    from tests.support.synthetic_profiles import profile_rows

    csv = tmp_path / "p.csv"
    csv.write_text("\n".join(profile_rows("lm_head", 4, 1)) + "\n")
    loaded = _modules_after("frontier", "--profile", str(csv), "--stages", "4", "--microbatches", "8", "--out",
                            str(tmp_path / "f.json"))
    assert "ampe.tradeoff.frontier" in loaded and (tmp_path / "f.json").exists()
    assert not [m for m in ("scipy", "pydantic", "yaml", "matplotlib", "numpy.ma") if m in loaded]


def test_search_loads_scipys_highs_bindings_alone(tmp_path):
    """``ampe search`` with energy planning solves its LPs through scipy's HiGHS bindings without importing
    ``scipy.optimize`` or ``scipy.sparse`` (~0.45 s CPU of the demo's imports), and imports no plotting, joblib or
    torch (docs/shares.md, "The demo's imports")."""
    from tests.conftest import SPECS

    loaded = _modules_after("search", "--cluster", str(SPECS / "local-cpu.yaml"), "--model", "gpt2-tiny",
                            "--global-batch", "4", "--out", str(tmp_path / "plan.json"))
    assert "scipy.optimize._highspy._core" in loaded and (tmp_path / "plan.json").exists()  # the LPs ran
    heavy = ("scipy.optimize", "scipy.sparse", "scipy.linalg", "scipy.special", "matplotlib", "joblib", "torch",
             "deepspeed")
    assert not [m for m in heavy if m in loaded]
