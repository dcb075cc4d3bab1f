"""Run a worker under an address-space limit: ``python -m ampe.trials.limits BYTES <python args...>``.

Sets ``RLIMIT_AS`` to BYTES, then ``exec``s ``python <python args...>`` (the limit survives exec). The runner puts
this in front of the worker so that the limit applies to each rank separately and not to torchrun itself (which
imports torch and would not start under a small limit). A rank that exceeds it gets ``MemoryError`` (Python) or a
failed allocation (C++), which the worker reports as an out-of-memory error.

RLIMIT_AS caps *virtual* memory, not resident memory: torch alone maps a few GiB, so limits for real CPU trials
must leave room for that; CUDA reserves huge address ranges, so the runner refuses a limit for GPU trials.
"""

from __future__ import annotations

import os
import resource
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        sys.stderr.write("usage: python -m ampe.trials.limits BYTES <python args...>\n")
        return 2
    try:
        limit = int(argv[0])
    except ValueError:
        sys.stderr.write(f"ampe.trials.limits: not a byte count: {argv[0]!r}\n")
        return 2
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)  # an unprivileged process may only lower its hard limit
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    os.execv(sys.executable, [sys.executable, *argv[1:]])
    return 127  # pragma: no cover - execv does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
