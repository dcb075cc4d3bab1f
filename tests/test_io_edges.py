"""Inputs are read only from bounded regular files, and outputs only ever replace regular files; every refusal is one
InputError naming the file (the CLI prints it on one line with exit status 2)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ampe.errors import InputError
from ampe.io import (
    MAX_NESTING,
    check_output_path,
    check_picture_path,
    read_json,
    read_text,
    read_yaml,
    undecodable,
    write_json_atomic,
)


def test_special_files_and_folders_are_not_inputs(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (tmp_path, fifo, Path("/dev/zero"), Path("/proc/self/environ"), ""):
        with pytest.raises(InputError):
            read_text(path)


def test_deep_nesting_and_non_finite_json_are_refused(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InputError, match="nested deeper"):
        read_json(deep)
    just_over = tmp_path / "over.json"
    just_over.write_text("[" * (MAX_NESTING + 2) + "]" * (MAX_NESTING + 2))
    at_limit = tmp_path / "ok.json"
    at_limit.write_text("[" * MAX_NESTING + "]" * MAX_NESTING)
    assert read_json(at_limit) is not None
    with pytest.raises(InputError, match="nested deeper"):
        read_json(just_over)
    yml = tmp_path / "deep.yaml"
    yml.write_text("a: " + "[" * 5000 + "]" * 5000)
    with pytest.raises(InputError):
        read_yaml(yml)
    for literal in ("NaN", "Infinity", "-Infinity"):
        bad = tmp_path / "nan.json"
        bad.write_text('{"strategy": {"pp": 1},\n "iteration_s": ' + literal + '}')
        with pytest.raises(InputError, match="not a number") as err:
            read_json(bad)
        assert err.value.field == "iteration_s"  # the key it is the value of
        bad.write_text('{"a": 1,\n "b": [1, ' + literal + ']}')
        with pytest.raises(InputError, match="not a number") as err:
            read_json(bad)
        assert err.value.field == "line 2"  # no key: its line
    bad.write_text('{"a": [NaN],\n "b": Infinity}')  # the first constant's place, not a later key
    with pytest.raises(InputError, match="NaN is not") as err:
        read_json(bad)
    assert err.value.field == "line 1"


def test_a_byte_order_mark_is_not_text_and_undecodable_lines_can_be_told_apart(tmp_path):
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + b'{"a": 1}')
    assert read_json(bom) == {"a": 1}
    mixed = tmp_path / "mixed.txt"
    mixed.write_bytes(b"good\nbad \xff\xfe\ngood again\n")
    with pytest.raises(InputError, match="not UTF-8"):
        read_text(mixed)
    lines = read_text(mixed, lenient=True).splitlines()
    assert [undecodable(x) for x in lines] == [False, True, False]


def test_outputs_replace_only_regular_writable_files(tmp_path):
    check_output_path(tmp_path / "new.json")  # missing: fine
    regular = tmp_path / "old.json"
    regular.write_text("{}")
    check_output_path(regular)
    for bad in (tmp_path, Path("/dev/full"), Path("/proc/p.json"), regular / "p.json", tmp_path / "nodir" / "p.json"):
        with pytest.raises(InputError):
            check_output_path(bad)
    readonly = tmp_path / "ro.json"
    readonly.write_text("{}")
    readonly.chmod(0o444)
    if os.geteuid() != 0:  # root may write anything, but ampe still refuses a read-only file (mode bits)
        assert not os.access(readonly, os.W_OK)
    with pytest.raises(InputError, match="read-only"):
        check_output_path(readonly)
    with pytest.raises(InputError, match="must end in"):
        check_picture_path(tmp_path / "x.svgz2", "--plot")
    check_picture_path(tmp_path / "x.svg", "--plot")


def test_symlinks_are_written_through(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    check_output_path(link)
    write_json_atomic(link, {"a": 1})
    assert link.is_symlink() and json.loads(target.read_text()) == {"a": 1}


def test_cli_refuses_bad_outputs_before_any_work(run_cli, tmp_path):
    for out in ("/tmp", "/proc/p.json", "/dev/full"):
        code, _, err = run_cli("search", "--cluster", "cluster_specs/local-cpu.yaml", "--model", "gpt2-tiny",
                               "--out", out)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "--out" in err, err
    code, _, err = run_cli("search", "--cluster", "", "--model", "gpt2-tiny")
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_every_option_has_help_text():
    from ampe.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    missing = [(name, a.option_strings) for name, p in sub.choices.items() for a in p._actions
               if not a.help and a.dest != "help"]
    assert missing == []


def test_long_names_are_not_echoed_back_whole(tmp_path):
    from ampe.costmodel.cluster import cluster_from_dict

    name = "n" * 10_000
    spec = {"name": "c", "nodes": [{"name": name, "gpu": "NoSuchGPU", "count": 1, "intra_gbps": 1, "inter_gbps": 1}]}
    with pytest.raises(InputError) as e:
        cluster_from_dict(spec, "c.yaml")
    assert len(str(e.value)) < 1000


def test_no_layout_covering_the_cluster_is_said_so(run_cli, tmp_path):
    spec = tmp_path / "big.yaml"
    spec.write_text("name: big\nnodes:\n  - {name: n, gpu: A100-40GB, count: 8, intra_gbps: 100, inter_gbps: 10, "
                    "repeat: 64}\n")  # 512 devices: pp ≤ 10 layers, tp ≤ 8, dp = 1
    code, _, err = run_cli("search", "--cluster", spec, "--model", "gpt2-tiny", "--global-batch", "1",
                           "--energy-planner", "none")
    assert code == 2 and "no parallel layout" in err and len(err.strip().splitlines()) == 1, err
