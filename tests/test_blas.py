"""ampe's own processes run one BLAS thread; the processes it launches get the user's environment (ampe.blas)."""

import json
import os
import subprocess
import sys

import pytest

from ampe.blas import THREAD_VARIABLES

PROBE = """
import json, os
from ampe.blas import launch_environ, limit_threads
limit_threads()
import numpy, threadpoolctl
blas = [p["num_threads"] for p in threadpoolctl.threadpool_info() if p["internal_api"] == "openblas"]
print(json.dumps({"blas_threads": blas, "here": os.environ.get("OPENBLAS_NUM_THREADS"),
                  "launched": launch_environ().get("OPENBLAS_NUM_THREADS")}))
"""


def _probe(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES} | extra
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def test_numpy_imported_after_the_limit_runs_one_blas_thread_and_children_do_not_inherit_it():
    r = _probe()
    if not r["blas_threads"]:  # the variable is OpenBLAS's; numpy's wheels on PyPI (and CI) bundle OpenBLAS
        pytest.skip("this numpy is not built with OpenBLAS")
    assert set(r["blas_threads"]) == {1}
    assert r["here"] == "1" and r["launched"] is None


def test_a_users_own_thread_setting_is_kept_for_ampe_and_for_what_it_launches():
    r = _probe(OPENBLAS_NUM_THREADS="2")
    assert r["here"] == "2" and r["launched"] == "2"
    r = _probe(OMP_NUM_THREADS="3")
    assert r["here"] is None and r["launched"] is None
