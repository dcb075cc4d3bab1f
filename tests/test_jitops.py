"""Where DeepSpeed's CPU op is built and how a dead builder's lock is told from a live one (ampe.jitops).

Every builder here is a real process doing what torch's ``FileBaton`` does (create ``lock`` with ``O_EXCL``, keep it
open, remove it when done) or what ampe's prebuild does (``flock`` on ``ampe-build.lock``); dead ones are SIGKILLed.
No test waits for a duration it then asserts: every step waits for an event (a line from the child, its exit)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import pytest

from ampe import jitops
from ampe.errors import InputError
from ampe.jitops import BATON, OP, ExtensionsDir

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
QUIET_S = 0.3  # the tests' quiet period (the default, 5 s, is for builds on other hosts)

BATON_HOLDER = """
import os, sys
fd = os.open(sys.argv[1], os.O_CREAT | os.O_EXCL)   # torch's FileBaton.try_acquire
print("held", flush=True)
sys.stdin.readline()                               # build until told to stop
os.close(fd); os.remove(sys.argv[1])               # FileBaton.release
"""

LOCK_HOLDER = """
import sys
import time
from pathlib import Path
from ampe.jitops import ExtensionsDir, build_lock
with build_lock(ExtensionsDir(Path(sys.argv[1]), True)):
    print("locked", flush=True)
    sys.stdin.readline()
"""

IDLE = "import sys; print('in', flush=True); sys.stdin.readline()"


def _child(code: str, *args: object, cwd: Path | None = None) -> subprocess.Popen:
    """A child that prints one line once it holds what it should, then waits for a line on stdin."""
    p = subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=ENV, cwd=cwd)
    assert p.stdout is not None and p.stdout.readline().strip() in ("held", "locked", "in")
    return p


def _kill(p: subprocess.Popen) -> None:
    p.send_signal(signal.SIGKILL)
    p.wait()


def _release(p: subprocess.Popen) -> None:
    assert p.stdin is not None
    p.stdin.write("go\n")
    p.stdin.flush()
    p.wait()


@pytest.fixture
def owned(tmp_path) -> ExtensionsDir:
    ext = ExtensionsDir(tmp_path / jitops.ROOT_NAME / "key", True)
    ext.op_dir.mkdir(parents=True)
    return ext


@pytest.fixture
def users(tmp_path) -> ExtensionsDir:
    ext = ExtensionsDir(tmp_path / "mine", False)
    ext.op_dir.mkdir(parents=True)
    return ext


# --- the keyed folder ----------------------------------------------------------------------------------------------


def test_the_keyed_folder_differs_when_torch_or_deepspeed_differ(monkeypatch, tmp_path):
    installed = {"torch": ("2.13.0+cpu", "/venv/a/torch"), "deepspeed": ("0.19.8", "/venv/a/deepspeed")}
    monkeypatch.setattr(jitops, "_package", lambda name: installed[name])
    env = {"HOME": str(tmp_path)}
    first = jitops.extensions_dir(env)
    assert first.owned and first.path.parent == tmp_path / ".cache" / "ampe-torch-extensions"
    assert first.path.name.startswith("torch2.13.0+cpu-ds0.19.8-py3")
    assert jitops.extensions_dir(env) == first  # the same environment, the same folder
    names = {first.path.name}
    for name, other in [("torch", ("2.12.0+cpu", "/venv/a/torch")), ("deepspeed", ("0.19.9", "/venv/a/deepspeed")),
                        ("deepspeed", ("0.19.8", "/venv/b/deepspeed"))]:  # same versions in another environment
        monkeypatch.setitem(installed, name, other)
        names.add(jitops.extensions_dir(env).path.name)
        monkeypatch.setitem(installed, "torch", ("2.13.0+cpu", "/venv/a/torch"))
        monkeypatch.setitem(installed, "deepspeed", ("0.19.8", "/venv/a/deepspeed"))
    names.add(jitops.extensions_dir({**env, "CXX": "clang++"}).path.name)  # another compiler
    assert len(names) == 5


SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # what `make` runs with


def test_the_makefile_and_an_activated_shell_key_the_same_folder_and_build_with_the_same_ninja(tmp_path):
    scripts = sysconfig.get_path("scripts")  # this environment's bin: first on PATH once activated
    make = {"HOME": str(tmp_path), "PATH": SYSTEM_PATH}
    activated = {"HOME": str(tmp_path), "PATH": f"{scripts}:{SYSTEM_PATH}"}
    assert jitops.key_fields(make) == jitops.key_fields(activated)
    assert jitops.extensions_dir(make) == jitops.extensions_dir(activated)
    used = {shutil.which("ninja", path=jitops.build_path(env)) for env in (make, activated)}
    assert len(used) == 1  # the one ninja every build runs, whichever shell started it
    if os.access(os.path.join(scripts, "ninja"), os.X_OK):
        assert used == {os.path.join(scripts, "ninja")}
        assert jitops.build_path(activated).split(":").count(scripts) == 1
    fields = jitops.key_fields(make)
    assert fields["ninja"] != "none" or shutil.which("ninja", path=SYSTEM_PATH) is None


def test_another_ninja_or_compiler_keys_another_folder(monkeypatch, tmp_path):
    versions = {"ninja": "1.11.1", "c++": "c++ (Debian 12.2.0-14) 12.2.0"}
    monkeypatch.setattr(jitops, "_tool_version", lambda name, path: versions[name])
    env = {"HOME": str(tmp_path), "PATH": SYSTEM_PATH}
    names = {jitops.extensions_dir(env).path.name}
    monkeypatch.setitem(versions, "ninja", "1.13.2")  # hashes build commands differently: stale to the other
    names.add(jitops.extensions_dir(env).path.name)
    monkeypatch.setitem(versions, "c++", "c++ (Debian 14.2.0-19) 14.2.0")
    names.add(jitops.extensions_dir(env).path.name)
    assert len(names) == 3


def test_a_short_hold_of_the_build_lock_is_waited_for_without_a_word(owned):
    holder = _child(LOCK_HOLDER, owned.path)  # another rank checking a built op
    said: list[str] = []
    try:
        def release_soon() -> None:
            time.sleep(0.3)
            _release(holder)

        releaser = threading.Thread(target=release_soon)
        releaser.start()
        with jitops.build_lock(owned, on_wait=said.append, say_after_s=30.0) as got:
            assert got
        releaser.join()
        assert said == []
    finally:
        if holder.poll() is None:
            _kill(holder)


def test_the_users_folder_is_kept_and_an_empty_one_counts_as_unset(tmp_path):
    mine = jitops.extensions_dir({"TORCH_EXTENSIONS_DIR": str(tmp_path / "mine"), "HOME": str(tmp_path)})
    assert mine == ExtensionsDir(tmp_path / "mine", False)
    keyed = jitops.extensions_dir({"HOME": str(tmp_path)})
    # what ampe hands its ranks is its own folder again
    assert jitops.extensions_dir({"TORCH_EXTENSIONS_DIR": str(keyed.path)}) == keyed
    assert jitops.extensions_dir({"TORCH_EXTENSIONS_DIR": "", "HOME": str(tmp_path)}) == keyed
    xdg = jitops.extensions_dir({"XDG_CACHE_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path)})
    assert xdg.path.parent == tmp_path / "xdg" / "ampe-torch-extensions" and xdg.owned


def test_no_home_folder_falls_back_to_a_private_temporary_folder(monkeypatch):
    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr("pathlib.Path.home", staticmethod(no_home))
    root = jitops.cache_root({})
    assert root.name == f"ampe-torch-extensions-{os.getuid()}"


# --- ampe's kernel lock ----------------------------------------------------------------------------------------------


def test_the_build_lock_is_held_by_one_process_and_freed_by_the_kernel_when_it_dies(owned):
    holder = _child(LOCK_HOLDER, owned.path)
    try:
        with jitops.build_lock(owned, wait=False) as got:
            assert not got
        said: list[str] = []

        def on_wait(line: str) -> None:  # called once, before blocking: the holder dies without releasing anything
            said.append(line)
            _kill(holder)

        with jitops.build_lock(owned, on_wait=on_wait, say_after_s=0.0) as got:
            assert got
        assert len(said) == 1 and f"(pid {holder.pid})" in said[0] and str(owned.path) in said[0]
    finally:
        if holder.poll() is None:
            _kill(holder)


# --- batons ----------------------------------------------------------------------------------------------------------


def test_a_dead_builders_baton_is_cleared_with_one_line(owned):
    baton = owned.op_dir / BATON
    _kill(_child(BATON_HOLDER, baton))  # a build killed midway: its lock stays
    jitops.mark_ready(owned)  # no library: nothing marked
    (owned.op_dir / jitops.READY_FILE).write_text("{}")
    assert baton.exists() and jitops.holders(baton) == ()
    said: list[str] = []
    with jitops.build_lock(owned):
        sweep = jitops.clear_stale(owned, said.append, quiet_s=QUIET_S)
    assert sweep.cleared == (baton,) and sweep.live == ()
    assert not baton.exists() and not (owned.op_dir / jitops.READY_FILE).exists()  # the build may be cut off
    assert said == [jitops.stale_message(baton)] and str(baton) in said[0] and "cleared" in said[0]


def test_a_live_builder_is_waited_on_and_its_lock_left_alone(owned):
    baton = owned.op_dir / BATON
    builder = _child(BATON_HOLDER, baton)
    try:
        said: list[str] = []
        with jitops.build_lock(owned):
            sweep = jitops.clear_stale(owned, said.append, quiet_s=QUIET_S)
            assert sweep.cleared == () and sweep.live == (jitops.Baton(baton, (builder.pid,)),)
            assert baton.exists() and said == []
            waits = []

            def sleep(s: float) -> None:  # the first wait: the build finishes and releases its lock
                waits.append(s)
                if len(waits) == 1:
                    _release(builder)

            assert jitops.wait_for_batons(owned, said.append, quiet_s=QUIET_S, sleep=sleep) == ()
        assert builder.returncode == 0 and not baton.exists()
        assert len(said) == 1 and "waiting for a running build" in said[0] and f"pid {builder.pid}" in said[0]
    finally:
        if builder.poll() is None:
            _kill(builder)


def test_a_builder_that_dies_while_waited_on_is_cleared(owned):
    baton = owned.op_dir / BATON
    builder = _child(BATON_HOLDER, baton)
    said: list[str] = []
    calls = []

    def sleep(s: float) -> None:
        calls.append(s)
        if builder.poll() is None:
            _kill(builder)
        time.sleep(s)

    with jitops.build_lock(owned):
        assert jitops.wait_for_batons(owned, said.append, quiet_s=QUIET_S, sleep=sleep) == (baton,)
    assert not baton.exists() and said[-1] == jitops.stale_message(baton)


def test_a_process_working_in_the_build_folder_counts_as_a_live_builder(owned):
    baton = owned.op_dir / BATON
    _kill(_child(BATON_HOLDER, baton))  # the Python builder died, its compiler (working in the folder) has not
    compiler = _child(IDLE, cwd=owned.op_dir)
    try:
        with jitops.build_lock(owned):
            sweep = jitops.clear_stale(owned, lambda s: None, quiet_s=QUIET_S)
        assert sweep.live == (jitops.Baton(baton, (compiler.pid,)),) and baton.exists()
    finally:
        _kill(compiler)
    with jitops.build_lock(owned):
        assert jitops.clear_stale(owned, lambda s: None, quiet_s=QUIET_S).cleared == (baton,)


def test_in_the_users_folder_a_dead_lock_is_named_and_not_deleted(users):
    baton = users.op_dir / BATON
    _kill(_child(BATON_HOLDER, baton))
    with jitops.build_lock(users), pytest.raises(InputError) as e:
        jitops.clear_stale(users, lambda s: None, quiet_s=QUIET_S)
    text = str(e.value)
    assert text.startswith("TORCH_EXTENSIONS_DIR: ") and str(baton) in text and "\n" not in text
    assert "unset TORCH_EXTENSIONS_DIR" in text and baton.exists()


def test_no_sweep_while_an_ampe_build_holds_the_lock(owned):
    baton = owned.op_dir / BATON
    _kill(_child(BATON_HOLDER, baton))
    holder = _child(LOCK_HOLDER, owned.path)
    try:
        assert jitops.sweep_unlocked(owned, lambda s: None, quiet_s=QUIET_S) == jitops.Sweep((), ())
        assert baton.exists()
    finally:
        _release(holder)
    assert jitops.sweep_unlocked(owned, lambda s: None, quiet_s=QUIET_S).cleared == (baton,)


def test_ready_means_built_marked_and_no_lock(owned):
    assert not jitops.is_ready(owned)
    owned.library.write_bytes(b"\x7fELF")
    jitops.mark_ready(owned)
    assert jitops.is_ready(owned)
    (owned.op_dir / BATON).touch()
    assert not jitops.is_ready(owned)
    assert not jitops.is_ready(ExtensionsDir(owned.path, False))  # ampe never vouches for the user's folder
    assert OP in str(owned.library)


def test_compilers_a_stopped_build_left_running_are_waited_for_before_building(owned):
    compiler = _child(IDLE, cwd=owned.op_dir)  # no baton: torch released it, its compiler still writes there
    said: list[str] = []

    def sleep(s: float) -> None:
        if compiler.poll() is None:
            _release(compiler)

    with jitops.build_lock(owned):
        assert jitops.wait_for_batons(owned, said.append, quiet_s=QUIET_S, sleep=sleep) == ()
    assert compiler.returncode == 0
    assert len(said) == 1 and f"still working in {owned.op_dir} (pid {compiler.pid})" in said[0]


def test_a_package_reached_through_a_link_keys_its_own_folder(tmp_path):
    """torch writes the path it was imported from into build.ninja: an environment reaching the same install through
    a link (a linked venv) keys its own folder rather than rebuilding the other's op at each start."""
    (tmp_path / "real" / "ampe_probe_pkg").mkdir(parents=True)
    (tmp_path / "real" / "ampe_probe_pkg" / "__init__.py").write_text("")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    import importlib
    import sys

    seen = []
    for root in ("real", "link"):
        sys.path.insert(0, str(tmp_path / root))
        try:
            importlib.invalidate_caches()
            jitops._package.cache_clear()  # cached per process: one environment per process
            seen.append(jitops._package("ampe_probe_pkg")[1])
        finally:
            sys.path.remove(str(tmp_path / root))
    assert seen == [str(tmp_path / "real" / "ampe_probe_pkg"), str(tmp_path / "link" / "ampe_probe_pkg")]
