"""Install: the build backend reads pyproject.toml without a deprecation warning (a `project.license` table printed
one three times per `pip install`), and the backend pinned in `build-system.requires` can read what it says."""

from __future__ import annotations

import re
import tomllib
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _apply(pyproject: Path) -> None:
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning (the deprecations included) fails the read
        apply_configuration(Distribution(), str(pyproject))


def test_pyproject_reads_without_a_warning(monkeypatch):
    monkeypatch.chdir(ROOT)  # the readme and packages are found relative to the project
    _apply(ROOT / "pyproject.toml")


def test_license_is_an_spdx_string_and_the_backend_pin_reads_it():
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert isinstance(doc["project"]["license"], str)  # PEP 639 (setuptools ≥ 77)
    (req,) = [r for r in doc["build-system"]["requires"] if r.startswith("setuptools")]
    low = re.fullmatch(r"setuptools>=(\d+)(?:\.\d+)*", req)
    assert low is not None and int(low.group(1)) >= 77, req


def test_a_license_table_would_warn(tmp_path, monkeypatch):
    """The check above can fail: the old table form warns under the venv's setuptools."""
    text = (ROOT / "pyproject.toml").read_text().replace('license = "Apache-2.0"', 'license = {text = "Apache-2.0"}')
    assert "license = {text" in text
    (tmp_path / "pyproject.toml").write_text(text)
    (tmp_path / "README.md").write_text("x\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Warning, match="license"):
        _apply(tmp_path / "pyproject.toml")
