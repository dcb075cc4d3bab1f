"""Inputs are read only from bounded regular files, and outputs only ever replace regular files; every refusal is one
InputError naming the file (the CLI prints it on one line with exit status 2)."""

from __future__ import annotations

import json
import os
import re
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


def test_symlinks_are_neither_written_through_nor_replaced(tmp_path):
    from ampe.errors import OutputError

    target = tmp_path / "real.json"
    target.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    with pytest.raises(InputError, match="symbolic link"):
        check_output_path(link)
    with pytest.raises(OutputError, match="symbolic link"):
        write_json_atomic(link, {"a": 1})
    assert link.is_symlink() and json.loads(target.read_text()) == {}


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


def test_names_no_system_call_or_line_can_hold_are_refused_by_name(tmp_path):
    from ampe.io import check_output_folder, exists, path_problem

    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    cases = {"a\x00b.json": "NUL byte", "a\nb.json": "control character", "x" * 256 + ".json": "261 bytes long"}
    for name, why in cases.items():
        assert why in (path_problem(str(tmp_path / name)) or "")
        for call in (read_text, check_output_path, check_output_folder):
            with pytest.raises(InputError, match=why):
                call(tmp_path / name)
        assert exists(tmp_path / name) is False  # never raises (Path.exists does for these)
    assert path_problem("é" * 127) is None  # 254 bytes
    assert "256 bytes long" in (path_problem("é" * 128) or "")  # 128 characters, 256 bytes
    with pytest.raises(InputError, match="is a symbolic link"):
        check_output_path(tmp_path / "loop1")
    with pytest.raises(InputError, match="Too many levels of symbolic links"):
        read_text(tmp_path / "loop1")
    with pytest.raises(InputError, match="not a folder"):
        check_output_folder("/dev/full")
    check_output_folder(tmp_path / "new" / "folder")  # missing: created later, with its parents


def _no_space(monkeypatch, tmp_path):
    """Every atomic write lands on /dev/full (ENOSPC), through a temporary file created where the real one is."""
    import tempfile

    real = tempfile.mkstemp

    def full(*args, **kw):
        fd, name = real(*args, **kw)
        os.close(fd)
        return os.open("/dev/full", os.O_WRONLY), name

    monkeypatch.setattr("ampe.io.tempfile.mkstemp", full)


def test_a_full_disk_is_one_line_and_leaves_nothing(run_cli, tmp_path, monkeypatch):
    _no_space(monkeypatch, tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    for argv in (["search", "--cluster", "cluster_specs/local-cpu.yaml", "--model", "gpt2-tiny", "--energy-planner",
                  "none", "--out", out / "plan.json"],
                 ["evaluate", "--cluster", "cluster_specs/local-cpu.yaml", "--model", "gpt2-tiny", "--strategy",
                  _strategy_file(tmp_path), "--json", out / "e.json"]):
        code, _, err = run_cli(*argv)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "cannot write (No space left on device); nothing was written" in err and str(out) in err
        assert list(out.iterdir()) == []  # no file, no temporary file


def _strategy_file(tmp_path: Path) -> Path:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"pp": 2, "dp": 1, "tp": 1, "mbs": 1, "gbs": 8}))
    return path


def _ampe(*argv, **kw):
    import subprocess
    import sys

    env = {**os.environ, **kw.pop("env", {})}
    return subprocess.run([sys.executable, "-m", "ampe", *map(str, argv)], capture_output=kw.pop("capture", True),
                          text=True, env=env, **kw)


def test_file_size_limit_on_out_and_json_is_one_line(tmp_path):
    import resource
    import signal

    def limit():  # EFBIG instead of SIGXFSZ's core dump
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))

    out = tmp_path / "out"
    out.mkdir()
    r = _ampe("evaluate", "--cluster", "cluster_specs/local-cpu.yaml", "--model", "gpt2-tiny", "--strategy",
              _strategy_file(tmp_path), "--json", out / "e.json", preexec_fn=limit)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "cannot write (File too large); nothing was written" in r.stderr
    assert list(out.iterdir()) == []


def test_standard_output_that_fails_is_one_line(tmp_path):
    import subprocess

    search = ["search", "--cluster", "cluster_specs/local-cpu.yaml", "--model", "gpt2-tiny", "--energy-planner",
              "none"]
    with open("/dev/full", "w") as full:  # tables, then the plan with --out -
        for argv in (search, [*search, "--out", "-"], ["search", "--help"]):
            r = _ampe(*argv, stdout=full, stderr=subprocess.PIPE, capture=False)
            assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
            assert "standard output: cannot write (No space left on device)" in r.stderr
    import sys

    closed = subprocess.Popen([sys.executable, "-m", "ampe", *search], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    closed.stdout.close()  # the reader is gone before anything is written: EPIPE
    err = closed.stderr.read()
    assert closed.wait() == 141 and err == "", err  # the conventional quiet exit (128 + SIGPIPE)


def test_an_ascii_terminal_gets_readable_tables_and_strict_data(tmp_path, monkeypatch):
    r = _ampe("search", "--cluster", "cluster_specs/local-cpu.yaml", "--model", "gpt2-tiny", "--energy-planner",
              "none", env={"PYTHONIOENCODING": "ascii"})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "gpt2-tiny on local-cpu (2 devices) ? " in r.stdout  # an em dash the encoding lacks
    import io
    import sys

    from ampe.io import write_text_atomic

    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO(), encoding="ascii"))
    with pytest.raises(InputError, match=re.escape("its encoding (ascii) cannot write; set PYTHONIOENCODING")):
        write_text_atomic("-", "é")  # data is never written with characters replaced


def test_share_flags_take_a_percent_or_a_fraction():
    import argparse

    from ampe.cli._common import margin_share, slowdown_share, watts

    assert slowdown_share("5%") == pytest.approx(0.05) and slowdown_share("0.05") == 0.05
    assert slowdown_share("1") == 1.0 and slowdown_share("150%") == pytest.approx(1.5)
    assert margin_share(" 5 % ") == pytest.approx(0.05)
    for text, words in (("5", "5 reads as 500 %; write 5% (or 0.05)"), ("1.5", "write 1.5% (or 0.015)"),
                        ("1e308", "at most 1000%"), ("nan", "finite share"), ("-1%", "finite share"),
                        ("2000%", "at most 1000%"), ("x", "not a share")):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(words)):
            slowdown_share(text)
    with pytest.raises(argparse.ArgumentTypeError, match="at most 100%"):
        margin_share("150%")
    assert watts("70") == 70.0
    for text in ("1e308", "inf", "nan", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            watts(text)
