"""Atomic writes: the file appears whole, with the permissions a plain open() would give it."""

from __future__ import annotations

import os
import stat

from ampe.io import read_json, write_json_atomic


def test_atomic_json_write_round_trips_with_umask_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        path = tmp_path / "sub" / "plan.json"
        write_json_atomic(path, {"a": [1, 2.5, None]})
        assert read_json(path) == {"a": [1, 2.5, None]}
        assert stat.S_IMODE(path.stat().st_mode) == 0o644  # not mkstemp's 0600: plans are shared files
        assert [p.name for p in path.parent.iterdir()] == ["plan.json"]  # no temporary file left behind
    finally:
        os.umask(old)
