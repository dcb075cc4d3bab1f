"""Stale JIT build locks: found by age under both torch layouts, never an error."""

from __future__ import annotations

import os
from pathlib import Path

from ampe.trials.buildlock import extensions_root, lock_advice, stale_locks


def _lock(path, age_s, now):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    os.utime(path, (now - age_s, now - age_s))
    return path


def test_old_locks_are_found_in_both_layouts_and_fresh_ones_are_not(tmp_path):
    now = 1_000_000.0
    flat = _lock(tmp_path / "deepspeed_shm_comm" / "lock", 3600, now)
    nested = _lock(tmp_path / "py311_cpu" / "deepspeed_shm_comm" / "lock", 700, now)
    _lock(tmp_path / "py311_cpu" / "other_op" / "lock", 30, now)  # a build running now
    assert stale_locks(tmp_path, older_than_s=600, now=now) == sorted([flat, nested])
    assert stale_locks(tmp_path, older_than_s=1000, now=now) == [flat]
    assert "delete it if no build" in lock_advice([flat]) and str(flat) in lock_advice([flat])
    assert lock_advice([]) == ""


def test_missing_root_and_env_override(tmp_path, monkeypatch):
    assert stale_locks(tmp_path / "absent") == []
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "x"))
    assert extensions_root() == tmp_path / "x"
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert extensions_root() == tmp_path / "cache" / "torch_extensions"


def test_no_home_folder_means_no_locks_not_an_error(monkeypatch):
    # A container user missing from /etc/passwd: Path.home() raises RuntimeError; the runner must not.
    for name in ("TORCH_EXTENSIONS_DIR", "XDG_CACHE_HOME", "HOME"):
        monkeypatch.delenv(name, raising=False)

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr("pathlib.Path.home", staticmethod(no_home))
    assert stale_locks() == []


def test_an_empty_extensions_dir_is_the_working_folder_as_for_torch(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "")
    monkeypatch.chdir(tmp_path)
    lock = _lock(tmp_path / "op" / "lock", 3600, 1e9)
    assert stale_locks(older_than_s=600, now=1e9) == [Path("op/lock")] and lock.exists()
