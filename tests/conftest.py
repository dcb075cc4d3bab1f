"""Shared fixtures: paths to bundled specs and data, and a CLI runner that captures exit code and output."""

from __future__ import annotations

import fcntl
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "cluster_specs"
AMP_PROFILE = ROOT / "ampe" / "data" / "amp_layer_profiles.csv"

os.environ.setdefault("DS_ACCELERATOR", "cpu")
# tables as wide as ampe draws them (200 columns): a header wraps by the width, and a test's temporary paths (longer
# under pytest-xdist's workers) must not decide which
os.environ.setdefault("COLUMNS", "200")

# CI draws the same examples every run (red means a change broke something, never an unlucky draw); a developer's
# run keeps drawing fresh ones, and whatever it finds is kept as an explicit example test.
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


HOST_LOCK = Path(tempfile.gettempdir()) / f"ampe-tests-host-{os.getuid()}.lock"  # per user: another user's runs
HOST_GATE = HOST_LOCK.with_suffix(".gate")  # a host_alone test waiting holds it: the other worker starts no new test
HOST_LOCK_WAIT_S = 1800.0  # longer than any one test holds it (the slowest take about 2 min on a busy machine)
_host_locks: dict[str, int] = {}


def _take_host_lock(exclusive: bool) -> int:
    """The host's test lock, exclusive or shared, writer first: an exclusive taker holds the gate while it waits, so
    the other worker's next test waits at the gate instead of taking the shared lock again and again (which could
    starve the exclusive one). A blocking wait, cut by a timer so that a hung session elsewhere fails this test in one
    line after :data:`HOST_LOCK_WAIT_S` instead of stalling the suite."""
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    gate = os.open(HOST_GATE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    fd = os.open(HOST_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)

    def _late(signum: int, frame: object) -> None:
        raise TimeoutError

    previous = signal.signal(signal.SIGALRM, _late)
    timer = signal.setitimer(signal.ITIMER_REAL, HOST_LOCK_WAIT_S)  # another's timer is put back after
    try:
        fcntl.flock(gate, mode)
        fcntl.flock(fd, mode)
    except TimeoutError:
        os.close(fd)
        pytest.fail(f"{HOST_LOCK}: still held by another test session after {HOST_LOCK_WAIT_S:.0f} s", pytrace=False)
    finally:
        signal.setitimer(signal.ITIMER_REAL, *timer)
        signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)
        os.close(gate)
    return fd


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    """A ``host_alone`` test holds this host's test lock alone; every other test shares it, from before its fixtures
    (module ones included) are set up until after they are torn down. Why: a trial runner ends every leftover of a
    dead runner on the host and warns of live ones (ampe.trials.lifetime), so a test that leaves ranks orphaned on
    purpose, or asserts a runner's exact output, must not overlap another xdist worker's trials."""
    if item.nodeid not in _host_locks:  # else: the lock the previous host_alone test kept for this one
        _host_locks[item.nodeid] = _take_host_lock(item.get_closest_marker("host_alone") is not None)
    yield


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield
    fd = _host_locks.pop(item.nodeid, None)
    alone = item.get_closest_marker("host_alone") is not None
    if fd is not None and alone and nextitem is not None and nextitem.get_closest_marker("host_alone") is not None:
        _host_locks[nextitem.nodeid] = fd  # consecutive host_alone tests wait for the other worker once
    elif fd is not None:
        os.close(fd)


@pytest.fixture
def run_cli(capsys):
    """Run ``ampe`` in-process; returns (exit_code, stdout, stderr)."""
    from ampe.cli import main

    def _run(*argv: str) -> tuple[int, str, str]:
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:  # argparse
            code = e.code if isinstance(e.code, int) else 1
        out = capsys.readouterr()
        return code, out.out, out.err

    return _run
