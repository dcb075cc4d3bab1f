#!/usr/bin/env bash
# benchmarks/gpu_check.sh — everything ampe can only check on a real GPU, in one call (docs/gpu_check.md):
#
#   profile Llama 3.2 1B at two sequence lengths (eager and flash attention, with and without full recomputation)
#   → search (one plan per attention × recomputation) → top-k trials (DeepSpeed, NCCL) → report → export + a user
#   script under the exported plan → a summary table, stored under tests/data/<gpu>/gpu_check/ for the CI test
#   (tests/e2e/test_gpu_check.py) that holds the cost model to it.
#
# No GPU setting is changed: a sitecustomize makes every NVML setter raise in every Python process the script starts
# (checked before anything runs), trials run with --freq-backend none, the profiler never locks clocks, and the
# power limit and clocks reported by nvidia-smi before and after are compared.
#
# Usage: benchmarks/gpu_check.sh [--dry-run] [--out DIR] [--python PY] [--wheels DIR] [--top-k K]
#   --dry-run   the same steps on this machine's CPU with a tiny Llama (llama-tiny, 2 blocks, seq 64 and 128);
#               CI runs it. Results go under --out only (never into tests/data).
#   --out DIR   working folder (default: a new temporary folder); on a GPU its data/ is also copied to tests/data
#   --python    the Python to run ampe with (default: .venv/bin/python if present, else python3)
#   --wheels    a folder of wheels (benchmarks/support/gpu_wheels.sh makes it) unpacked, offline and without their
#               dependencies, into a folder put on PYTHONPATH: the lent GPU machines reach no package index, and
#               their python3 is itself a venv holding torch, so a venv made on top of it would lose torch
#   --top-k     trials of the flash/no-recomputation plan (default 2: the micro-batch trend); the other three
#               plans run their best strategy
#
# What comes back from a lent machine: $OUT/gpu_check_data.tgz (everything stored) and $OUT/summary.md (the table).
# Store it here with: mkdir -p tests/data/<gpu>/gpu_check && tar -xzf gpu_check_data.tgz -C tests/data/<gpu>/gpu_check
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DRY=0
OUT=""
PY=""
WHEELS=""
TOPK=2
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --out) OUT="$2"; shift ;;
        --python) PY="$2"; shift ;;
        --wheels) WHEELS="$2"; shift ;;
        --top-k) TOPK="$2"; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
        *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
case "$TOPK" in ''|*[!0-9]*) echo "gpu_check: --top-k must be a positive integer, got $TOPK" >&2; exit 2 ;; esac
[ "$TOPK" -ge 1 ] || { echo "gpu_check: --top-k must be ≥ 1" >&2; exit 2; }
if [ -z "$PY" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY="$(command -v python3)"; fi
fi
if [ -z "$OUT" ]; then OUT="$(mktemp -d "${TMPDIR:-/tmp}/ampe-gpu-check.XXXXXX")"; fi
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
T0=$(date +%s)
say() { echo "gpu_check [$(( $(date +%s) - T0 )) s]: $*" >&2; }

SITE=""
if [ -n "$WHEELS" ]; then  # offline, no dependency resolution: the wheels are what the machine's Python lacks
    SITE="$OUT/site"
    "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl >&2
fi

# --- guard: no NVML setter can run in any process started from here ---------------------------------------------
mkdir -p "$OUT/guard"
cat > "$OUT/guard/sitecustomize.py" <<'EOF'
"""gpu_check's guard: every NVML call that changes something raises, in every Python process (no GPU setting,
clock, power limit, MIG layout or mode may change). Reading calls stay (Get, Query, Init, Shutdown, ...)."""
try:
    import pynvml as _nvml
except Exception:  # no NVML bindings: nothing in Python can set anything
    _nvml = None
if _nvml is not None:
    _CHANGES = ("Set", "Reset", "Clear", "Create", "Destroy", "Modify", "Enable", "Disable", "Register", "Freeze",
                "Remove", "Discover", "Write")

    def _blocked(name):
        def refuse(*args, **kwargs):
            raise RuntimeError(f"gpu_check: {name} is blocked: this check changes no GPU setting")
        return refuse
    for _name in dir(_nvml):
        if _name.startswith("nvml") and "Get" not in _name and any(w in _name for w in _CHANGES):
            setattr(_nvml, _name, _blocked(_name))
EOF
export PYTHONPATH="$OUT/guard:$ROOT${SITE:+:$SITE}${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
"$PY" - <<'EOF' || { echo "gpu_check: the NVML guard is not in force; stopping before anything runs" >&2; exit 1; }
import importlib.util
if importlib.util.find_spec("pynvml") is not None:
    import pynvml
    try:
        pynvml.nvmlDeviceSetGpuLockedClocks(None, 0, 0)
    except RuntimeError as e:
        assert "blocked" in str(e), e
    else:
        raise SystemExit("an NVML setter ran")
EOF
"$PY" - <<'EOF' || { echo "gpu_check: $PY lacks what ampe needs (carry wheels: --wheels DIR)" >&2; exit 1; }
import importlib.util, sys
missing = [m for m in ("torch", "deepspeed", "pydantic", "yaml", "rich", "scipy", "joblib", "numpy")
           if importlib.util.find_spec(m) is None]
if missing:
    sys.exit("missing Python packages: " + ", ".join(missing))
EOF
AMPE=("$PY" -m ampe)
say "guard in force (NVML setters raise); python $("$PY" -c 'import sys; print(sys.version.split()[0])')"

# --- the device, the models, the cluster --------------------------------------------------------------------------
DATA="$OUT/data"
mkdir -p "$DATA" "$OUT/models" "$OUT/work"
if [ "$DRY" = 1 ]; then
    export DS_ACCELERATOR=cpu
    DEVICE=cpu; GPU=cpu; BASE=llama-tiny; SEQS="64 128"; MBS=1,2; GBS=4; BLOCKS=2; WARMUP=2; ITERS=2
    PROFILE_ARGS=(--warmup 1 --repeats 2)
else
    DEVICE=cuda; BASE=llama-3.2-1b; SEQS="1024 4096"; MBS=1,2,4; GBS=8; BLOCKS=""; WARMUP=2; ITERS=3
    PROFILE_ARGS=(--warmup 2 --repeats 5)
    GPU="$("$PY" -c 'import torch; from ampe.profiling.profiler import catalog_gpu_name as c; p = torch.cuda.get_device_properties(0); print(c(torch.cuda.get_device_name(0), p.total_memory))')"
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.applications.graphics,power.limit,enforced.power.limit \
        --format=csv > "$DATA/nvidia_smi_before.csv" 2>&1 || true
fi
"$PY" - "$DATA/environment.json" "$GPU" <<'EOF'
import json, platform, sys
import deepspeed, torch
env = {"gpu": sys.argv[2], "torch": torch.__version__, "deepspeed": deepspeed.__version__,
       "python": platform.python_version(), "cuda": torch.version.cuda,
       "device_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}
json.dump(env, open(sys.argv[1], "w"), indent=1)
EOF
say "device $GPU ($DEVICE); models: $BASE at seq ${SEQS// /, }"
for seq in $SEQS; do
    { echo "name: ${BASE}-s$seq"; echo "base: $BASE"; echo "seq_len: $seq";
      [ -n "$BLOCKS" ] && echo "layers: $BLOCKS"; } > "$OUT/models/s$seq.yaml"
done
cat > "$OUT/cluster.yaml" <<EOF
name: one-$GPU
nodes:
  - {name: node0, gpu: $GPU, count: 1, intra_gbps: 3600, inter_gbps: 100}
EOF
cp "$OUT"/models/*.yaml "$OUT/cluster.yaml" "$DATA/"

# --- 1. profile: each sequence length, both kernels, with and without full recomputation ------------------------
LONG="${SEQS##* }"
for seq in $SEQS; do
    csv="$DATA/profile_s$seq.csv"
    rm -f "$csv"
    for att in eager flash; do
        energy=(--no-energy)  # NVML's per-layer energy window (0.5 s each) only for the planned long-sequence rows
        [ "$seq" = "$LONG" ] && [ "$att" = flash ] && energy=()
        "${AMPE[@]}" profile --model "$OUT/models/s$seq.yaml" --device "$DEVICE" --attention "$att" \
            --recompute none,full --mbs "$MBS" "${PROFILE_ARGS[@]}" "${energy[@]}" --out "$OUT/work/p.csv" >&2
        if [ -f "$csv" ]; then tail -n +2 "$OUT/work/p.csv" >> "$csv"; else cp "$OUT/work/p.csv" "$csv"; fi
    done
    say "profiled seq $seq"
done

# --- 2. search and 3. trials: one plan per attention × recomputation at the long sequence ----------------------
MODEL="$OUT/models/s$LONG.yaml"
for att in flash eager; do
    for rec in none full; do
        name="${att}_$rec"
        k=1
        [ "$name" = flash_none ] && k=$TOPK
        "${AMPE[@]}" search --cluster "$OUT/cluster.yaml" --model "$MODEL" --profile "$DATA/profile_s$LONG.csv" \
            --attention "$att" --recompute "$rec" --zero 0 --global-batch "$GBS" --top-k 4 \
            --out "$OUT/work/plan_$name.json" > "$OUT/work/search_$name.txt"
        # an OOM or crash is a finding, recorded in results.jsonl: `ampe trial` exits 1 when nothing ran ok
        "${AMPE[@]}" trial --plan "$OUT/work/plan_$name.json" --out "$OUT/work/trials_$name" --top-k "$k" \
            --freq-backend none --warmup "$WARMUP" --iters "$ITERS" --timeout 300 --run-unfit >&2 \
            || say "plan $name: no trial ran ok (recorded)"
        "${AMPE[@]}" report "$OUT/work/trials_$name" --json "$OUT/work/report_$name.json" \
            > "$OUT/work/report_$name.txt"
        cp "$OUT/work/trials_$name/results.jsonl" "$DATA/trials_$name.jsonl"
        say "plan $name: $k trial(s)"
    done
done

# --- 4. export the best flash strategy and train it from a user script under the exported plan ------------------
"${AMPE[@]}" export --plan "$OUT/work/plan_flash_none.json" --rank 1 --out "$OUT/work/export" \
    --script "$ROOT/benchmarks/support/train_exported.py" --master-port 29517 > "$OUT/work/export.txt"
(cd "$OUT/work/export" && /bin/sh ./launch.sh --warmup "$WARMUP" --iters "$ITERS" --report "$DATA/user_script.json") >&2
cp "$OUT/work/export/measurements.jsonl" "$DATA/user_measurements.jsonl"
cp "$OUT/work/export/ds_config.json" "$DATA/export_ds_config.json"
"${AMPE[@]}" report --measurements "$DATA/user_measurements.jsonl" --cluster "$OUT/cluster.yaml" --model "$MODEL" \
    --profile "$DATA/profile_s$LONG.csv" > "$OUT/work/report_user.txt"
say "exported plan rank 1 trained by the user script"

if [ "$DRY" != 1 ]; then
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.applications.graphics,power.limit,enforced.power.limit \
        --format=csv > "$DATA/nvidia_smi_after.csv" 2>&1 || true
    # the settings (maximum and application clocks, power limits) must read as before; the current SM clock moves
    "$PY" - "$DATA/nvidia_smi_before.csv" "$DATA/nvidia_smi_after.csv" <<'EOF' || exit 1
import csv, sys
before, after = (list(csv.DictReader(open(p))) for p in sys.argv[1:3])
if not before or not after:
    sys.exit("gpu_check: nvidia-smi gave no reading to compare the GPU's settings with")
changed = [k for k in before[0] if k.strip() != "clocks.current.sm [MHz]" and not k.strip().startswith("clocks.sm")
           and before[0].get(k) != after[0].get(k)]
if changed:
    sys.exit(f"gpu_check: GPU settings changed during the check: {', '.join(changed)}")
print("gpu_check: the GPU's clocks and power limits read as before the check", file=sys.stderr)
EOF
fi

# --- 5. the summary, and where the data is kept ------------------------------------------------------------------
"$PY" "$ROOT/benchmarks/support/gpu_check_summary.py" "$DATA" --record | tee "$OUT/summary.md"
tar -czf "$OUT/gpu_check_data.tgz" -C "$DATA" .  # one file: what a lent machine hands back
if [ "$DRY" != 1 ]; then
    dest="$ROOT/tests/data/$(echo "$GPU" | cut -d- -f1 | tr 'A-Z' 'a-z')/gpu_check"
    mkdir -p "$dest"
    cp "$DATA"/* "$dest/"
    say "stored under $dest and in $OUT/gpu_check_data.tgz (from a lent machine bring the .tgz back, unpack it"
    say "into tests/data/<gpu>/gpu_check and commit it; tests/e2e/test_gpu_check.py holds the cost model to it)"
fi
say "done in $(( $(date +%s) - T0 )) s; everything under $OUT"
