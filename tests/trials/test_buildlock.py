"""The runner's side of DeepSpeed's JIT-built op (ampe.trials.buildlock): the ranks' TORCH_EXTENSIONS_DIR, the
prebuild's lines relayed as they come, its failure as one line, a stop while it builds; and, for GPU trials, old
build locks in torch's own folder named by age. The real build is in test_prebuild_kill.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ampe import jitops
from ampe.errors import InputError
from ampe.trials import buildlock
from ampe.trials.buildlock import extensions_root, lock_advice, stale_locks
from ampe.trials.commands import base_env


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A private cache: ampe's keyed folder lands under it, never in the machine's shared one."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    return tmp_path / "cache"


def _fake_prebuild(monkeypatch, code: str) -> None:
    monkeypatch.setattr(buildlock, "prebuild_argv", lambda: [sys.executable, "-c", code])


# --- the ranks' folder -----------------------------------------------------------------------------------------------


def test_cpu_ranks_get_ampes_keyed_folder_or_the_users_own(cache, monkeypatch, tmp_path):
    keyed = jitops.extensions_dir()
    assert keyed.owned and keyed.path.parent == cache / "ampe-torch-extensions"
    assert base_env("cpu")["TORCH_EXTENSIONS_DIR"] == str(keyed.path)
    assert "TORCH_EXTENSIONS_DIR" not in base_env("cuda")  # GPU ranks keep torch's own folder
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "mine"))
    assert base_env("cpu")["TORCH_EXTENSIONS_DIR"] == str(tmp_path / "mine")
    assert base_env("cpu", {"TORCH_EXTENSIONS_DIR": "/x"})["TORCH_EXTENSIONS_DIR"] == "/x"


# --- the prebuild, as the runner runs it ----------------------------------------------------------------------------


def test_the_builders_lines_are_relayed_and_a_ready_folder_starts_nothing(cache, monkeypatch):
    _fake_prebuild(monkeypatch, "import sys; sys.stderr.write('ampe: building it once\\nampe: done\\n')")
    said: list[str] = []
    env = {**os.environ, **base_env("cpu")}
    assert buildlock.prebuild(env, said.append) is True
    assert said == ["building it once", "done"]
    ext = jitops.extensions_dir(env)
    ext.op_dir.mkdir(parents=True)
    ext.library.write_bytes(b"\x7fELF")
    jitops.mark_ready(ext)
    _fake_prebuild(monkeypatch, "raise SystemExit('must not run')")
    assert buildlock.prebuild(env, said.append) is True and len(said) == 2


def test_a_failed_build_is_one_line_naming_the_folder(cache, monkeypatch):
    _fake_prebuild(monkeypatch, "import sys; sys.stderr.write('ampe: building\\nampe: error: g++ not found\\n'); "
                                "sys.exit(1)")
    said: list[str] = []
    env = {**os.environ, **base_env("cpu")}
    with pytest.raises(InputError) as e:
        buildlock.prebuild(env, said.append)
    assert said == ["building"]
    assert str(e.value) == f"{jitops.extensions_dir(env).path}: no DeepSpeed rank can start: g++ not found"


def test_a_stop_while_building_ends_the_builders_whole_group(cache, monkeypatch, tmp_path):
    # the builder starts a child of its own (as ninja starts compilers) and both wait forever
    marker = tmp_path / "child.pid"
    _fake_prebuild(monkeypatch, "import subprocess, sys, time; "
                                "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)']); "
                                f"open({str(marker)!r}, 'w').write(str(c.pid)); "
                                "sys.stderr.write('ampe: building\\n'); sys.stderr.flush(); time.sleep(3600)")
    said: list[str] = []
    polls = []

    def stop() -> bool:
        polls.append(1)
        return bool(said) and marker.exists() and marker.read_text() != ""

    assert buildlock.prebuild({**os.environ, **base_env("cpu")}, said.append, stop=stop, grace_s=2.0) is False
    assert said == ["building"]
    assert _gone(int(marker.read_text()))


def _gone(pid: int) -> bool:
    """Whether ``pid`` ended (a zombie waiting for init to reap it counts as ended), waiting up to 30 s for it."""
    import time

    psutil = pytest.importorskip("psutil")
    for _ in range(600):
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_a_stale_lock_in_the_users_folder_stops_before_any_build(tmp_path, monkeypatch):
    mine = tmp_path / "mine"
    (mine / jitops.OP).mkdir(parents=True)
    (mine / jitops.OP / "lock").touch()  # nobody holds it
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(mine))
    _fake_prebuild(monkeypatch, "raise SystemExit('must not run')")
    with pytest.raises(InputError) as e:
        buildlock.prebuild({**os.environ, **base_env("cpu")}, lambda s: None, quiet_s=0.2)
    assert str(e.value).startswith("TORCH_EXTENSIONS_DIR: ") and (mine / jitops.OP / "lock").exists()


# --- GPU trials: torch's own folder, locks named by age --------------------------------------------------------------


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
