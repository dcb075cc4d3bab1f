#!/usr/bin/env bash
# Make the wheels `benchmarks/gpu_check.sh --wheels DIR` installs on a lent GPU machine, which reaches no package
# index: what ampe needs beyond the machine's own Python 3.12 with torch, numpy and scipy (see its page in
# /work/.library/device/KINDS.md). Run it here, where PyPI is reachable; pass the folder to the device tool's `carry`
# (it must sit in the repository, ignored by git: e.g. .gpu-wheels, listed in .git/info/exclude).
#
# Usage: benchmarks/support/gpu_wheels.sh [DIR] (default .gpu-wheels); PYV=3.12 for another Python version.
set -euo pipefail
DEST="${1:-.gpu-wheels}"
PYV="${PYV:-3.12}"
PIP=(python3 -m pip)
[ -x .venv/bin/python ] && PIP=(.venv/bin/python -m pip)
mkdir -p "$DEST"
# binary wheels for the machine's Python, with their own dependencies resolved for it
"${PIP[@]}" download -q --only-binary=:all: --python-version "$PYV" --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$DEST" pydantic rich pyyaml joblib hjson py-cpuinfo msgpack einops ninja tqdm nvidia-ml-py psutil
# DeepSpeed is published as a source archive only: build its (pure Python, no ops) wheel here, without dependencies
DS_BUILD_OPS=0 "${PIP[@]}" wheel -q --no-deps "deepspeed==0.19.8" -w "$DEST"
ls "$DEST" >&2
du -sh "$DEST" >&2
