"""Issue 36, item 1: no output of any command may name one of its inputs or another of its outputs (the same name, a
symbolic link, a hard link). Generated from the one table of every command's inputs and outputs
(ampe/cli/_paths.py): every (input, output) pair of every command is tried, and every option that takes a file name
must be in the table, so a new flag cannot escape the rule."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import pytest

from ampe.cli import build_parser, main
from ampe.cli._paths import COMMANDS, FOLDER, PICTURE, PathArg

PREFIX = {"dvfs": ["dvfs", "fit"]}  # a command whose options live on a verb


def _leaf(command: str) -> argparse.ArgumentParser:
    parser = build_parser(command)
    for word in PREFIX.get(command, [command]):
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return parser


def _option(parser: argparse.ArgumentParser, attr: str) -> argparse.Action:
    return next(a for a in parser._actions if a.dest == attr)


def _required(parser: argparse.ArgumentParser, taken: set[str]) -> list[str]:
    """Placeholder values for the required options not under test (never read: the check comes first)."""
    argv: list[str] = []
    groups = [g for g in parser._mutually_exclusive_groups if g.required]
    grouped = {a.dest for g in groups for a in g._group_actions}
    for a in parser._actions:
        if a.required and a.option_strings and a.dest not in taken and a.dest not in grouped:
            argv += [a.option_strings[0], "placeholder"]
    for g in groups:
        if not any(a.dest in taken for a in g._group_actions):
            argv += [g._group_actions[0].option_strings[0], "placeholder"]
    return argv


def _words(parser: argparse.ArgumentParser, arg: PathArg, value: str) -> list[str]:
    action = _option(parser, arg.attr)
    return [value] if not action.option_strings else [action.option_strings[0], value]


# every pair; through links only where neither is a folder (a folder is named as it is); no picture in a trials folder
CASES = [(c, i, o, how) for c, paths in COMMANDS.items() for i in paths.inputs for o in paths.outputs
         for how in ("same", "symlink", "hardlink")
         if (how == "same" or FOLDER not in (i.kind, o.kind)) and not (i.kind == FOLDER and o.kind == PICTURE)]


@pytest.mark.parametrize(("command", "inp", "out", "how"), CASES,
                         ids=[f"{c}:{i.flag}->{o.flag}:{how}" for c, i, o, how in CASES])
def test_no_output_names_an_input(command, inp, out, how, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = "same.png" if out.kind == PICTURE else "same.json"
    # the file both name: for an output folder, a file it writes; for an input folder, a file it reads
    out_value = in_value = name
    if out.kind == FOLDER:
        out_value = "outdir"
        inner = out.within[0] if not out.within[0].endswith("/") else out.within[0] + "x.json"
        in_value = os.path.join("outdir", inner)
    if inp.kind == FOLDER:
        in_value = "indir"
        out_value = os.path.join("indir", inp.within[0])
    shared = Path(in_value if inp.kind != FOLDER else out_value)
    shared.parent.mkdir(parents=True, exist_ok=True)
    shared.write_text("precious\n")
    if how != "same":  # the output names the input through a link
        other = Path("other" + shared.suffix)
        (other.symlink_to if how == "symlink" else other.hardlink_to)(shared.resolve())
        if how == "symlink":  # the input is reached through the link: the output is the real file
            in_value = str(other)
        else:
            out_value = str(other)
    parser = _leaf(command)
    argv = [*PREFIX.get(command, [command]), *_required(parser, {inp.attr, out.attr}),
            *_words(parser, inp, in_value), *_words(parser, out, out_value)]
    before = sorted(p.name for p in tmp_path.rglob("*"))

    code = main(argv)

    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert out.flag in err and ("is also the input" in err or "is also" in err), err
    assert shared.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


FILE_METAVAR = re.compile(r"\.(json|jsonl|yaml|csv|png|py)\b|DIR|CSV", re.IGNORECASE)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_naming_a_file_is_declared(command):
    parser = _leaf(command)
    declared = {a.attr for a in (*COMMANDS[command].inputs, *COMMANDS[command].outputs)}
    for a in parser._actions:
        names_file = a.dest == "out" or (isinstance(a.metavar, str) and FILE_METAVAR.search(a.metavar))
        if names_file:
            assert a.dest in declared, f"{command} {a.option_strings or a.dest}: declare it in ampe/cli/_paths.py"
    for attr in declared:
        _option(parser, attr)  # no stale declaration


def test_every_command_with_files_is_in_the_table():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in sub.choices:
        for word in PREFIX.get(name, [name])[1:]:
            leaf = next(a for a in sub.choices[name]._actions if isinstance(a, argparse._SubParsersAction))
            assert word in leaf.choices
        leaf = _leaf(name)
        if any(isinstance(a.metavar, str) and FILE_METAVAR.search(a.metavar) for a in leaf._actions):
            assert name in COMMANDS, name


def test_two_outputs_and_standard_output(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["replan", "--plan", "p.json", "--out", "x.json", "--cluster-out", "x.json"]) == 2
    assert "each output needs a file of its own" in capsys.readouterr().err
    assert main(["frontier", "--plan", "p.json", "--out", "-", "--export-profile", "-"]) == 2
    assert "standard output is also --out's" in capsys.readouterr().err


def test_an_output_that_is_a_symbolic_link_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    from ampe.errors import OutputError
    from ampe.io import write_text_atomic
    from ampe.outfolder import OutputFolder

    monkeypatch.chdir(tmp_path)
    Path("victim.json").write_text("keep\n")
    Path("link.json").symlink_to("victim.json")
    assert main(["replan", "--plan", "p.json", "--out", "link.json"]) == 2
    assert "symbolic link" in capsys.readouterr().err
    with pytest.raises(OutputError, match="symbolic link"):
        write_text_atomic("link.json", "x")
    with OutputFolder(tmp_path) as folder, pytest.raises(OutputError, match="symbolic link"):
        folder.write_text("link.json", "x")
    assert Path("victim.json").read_text() == "keep\n" and Path("link.json").is_symlink()


def test_trials_default_folder_may_not_hold_its_plan(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "plan").mkdir(parents=True)
    (tmp_path / "runs" / "plan" / "plan.json").write_text("precious\n")
    assert main(["trial", "--plan", "runs/plan/plan.json", "--dry-run"]) == 2  # default --out: runs/<plan name>
    assert "is also the input --plan" in capsys.readouterr().err
    assert (tmp_path / "runs" / "plan" / "plan.json").read_text() == "precious\n"


def test_the_sidecar_suffix_is_the_formats_one():
    from ampe.cli._paths import SIDECAR_SUFFIX
    from ampe.formats.calibration import SIDECAR_SUFFIX as FORMAT_SUFFIX

    assert SIDECAR_SUFFIX == FORMAT_SUFFIX


def test_an_export_may_not_replace_a_replicas_config_it_reads(tmp_path, capsys, monkeypatch):
    """Uneven shares write one DeepSpeed config per replica (a pattern in the table): one of them as the input plan
    is refused like the fixed names."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "ds_config_replica1.json").write_text("precious\n")
    assert main(["export", "--plan", "exp/ds_config_replica1.json", "--out", "exp", "--script", "t.py"]) == 2
    assert "is also the input --plan" in capsys.readouterr().err
    assert (tmp_path / "exp" / "ds_config_replica1.json").read_text() == "precious\n"
