"""Mistakes name the fix: the closest model, GPU type or flag (case and punctuation ignored), in one line prefixed
with the command (``ampe search: error: ...``), exit 2."""

from __future__ import annotations

import pytest

from ampe.costmodel.catalog import CATALOG
from ampe.costmodel.zoo import zoo_names
from ampe.errors import suggest
from tests.conftest import SPECS


@pytest.mark.parametrize(("word", "known", "expected"), [
    ("llama3-8b", zoo_names(), "llama-3.1-8b"), ("Llama-3.2-1B", zoo_names(), "llama-3.2-1b"),
    ("gpt2amp", zoo_names(), "gpt2-amp"), ("a100", CATALOG, "A100-40GB"), ("RTX-4090", CATALOG, "RTX3090"),
    ("h200", CATALOG, "H200"), ("--global-bach", ["--global-batch", "--cluster"], "--global-batch"),
    ("quantum-7", zoo_names(), None), ("", CATALOG, None)])
def test_the_closest_known_name(word, known, expected):
    assert suggest(word, known) == expected


def _one_line(code: int, err: str, prefix: str) -> str:
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith(prefix), err
    return err


def test_a_misspelt_model_gpu_type_or_flag_is_one_line_naming_the_fix(run_cli, tmp_path):
    tiny = ("--cluster", SPECS / "local-cpu.yaml", "--global-batch", "8")
    err = _one_line(*run_cli("search", *tiny, "--model", "llama3-8b")[::2], "ampe search: error: --model: ")
    assert "unknown model 'llama3-8b' (did you mean llama-3.1-8b?)" in err
    spec = tmp_path / "c.yaml"
    spec.write_text("name: c\nnodes:\n  - {name: n, gpu: RTX-4090, count: 2, intra_gbps: 10, inter_gbps: 10}\n")
    err = _one_line(*run_cli("search", "--cluster", spec, "--model", "gpt2-tiny", "--global-batch", "8")[::2],
                    "ampe search: error: ")
    assert "unknown GPU type 'RTX-4090' (did you mean RTX3090?)" in err and "nodes[0].gpu" in err
    err = _one_line(*run_cli("search", *tiny, "--model", "gpt2-tiny", "--global-bach", "8")[::2],
                    "ampe search: error: ")  # the subcommand's prefix, not "ampe:"
    assert "unrecognized arguments: --global-bach 8 (did you mean --global-batch?)" in err
