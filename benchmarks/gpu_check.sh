#!/usr/bin/env bash
# benchmarks/gpu_check.sh — everything ampe can only check on a real GPU, in one call of at most 7 minutes
# (docs/gpu_check.md):
#
#   profile Llama 3.2 1B at seq 4096 (eager and flash attention, recomputation none and full, one block of the 16
#   identical ones measured) → merge the two profiles (ampe profile --merge) → search (one plan per attention ×
#   recomputation, and the flash/none plan with expandable segments on) → trials (DeepSpeed, NCCL) → report → export
#   + a user script under the exported plan → a summary table, stored under tests/data/<gpu>/gpu_check/ for the CI
#   test (tests/e2e/test_gpu_check.py) that holds the cost model to it.
#
# Before anything runs it prints its GPU time estimate, step by step, at the pace measured on one H200
# (benchmarks/support/gpu_check_budget.py), and stops if that exceeds --budget. Everything it makes is kept under
# --out: a second call with the same --out continues where the first stopped (a timeout included): profiles made
# with the same arguments are reused, searches are not redone while their inputs are unchanged, `ampe trial` keeps
# the finished trials of its results.jsonl, the exported plan's run is kept.
#
# No GPU setting is changed: a sitecustomize makes every NVML setter raise in every Python process the script starts
# (checked before anything runs), trials run with --freq-backend none, the profiler never locks clocks, and the
# power limit and clocks reported by nvidia-smi before the first call and after the last are compared.
#
# Usage: benchmarks/gpu_check.sh [--dry-run] [--out DIR] [--python PY] [--wheels DIR] [--top-k K] [--seqs LIST]
#                                [--budget S]
#   --dry-run   the same steps, files and columns on this machine's CPU with a tiny Llama (llama-tiny, 2 blocks,
#               seq 128; the flash profile's energy from the CPU's modelled meter, labelled modelled); CI runs it.
#               Results go under --out only (never into tests/data). It prints the GPU estimate too.
#   --out DIR   working folder (default: a new temporary folder); on a GPU its data/ is also copied to tests/data
#   --python    the Python to run ampe with (default: .venv/bin/python if present, else python3)
#   --wheels    a folder of wheels (benchmarks/support/gpu_wheels.sh makes it) unpacked, offline and without their
#               dependencies, into a folder put on PYTHONPATH: the lent GPU machines reach no package index, and
#               their python3 is itself a venv holding torch, so a venv made on top of it would lose torch
#   --top-k     trials of the flash/no-recomputation plan (default 1; 2 adds the micro-batch trend, about 42 s);
#               the other plans run their best strategy
#   --seqs      sequence lengths to profile, the longest searched and trialled (default 4096; dry run 128)
#   --budget    seconds the GPU estimate may reach (default 420); above it the check stops before it starts
#
# What comes back from a lent machine: $OUT/gpu_check_data.tgz (everything stored) and $OUT/summary.md (the table),
# also when a step fails or the call is stopped (SIGTERM, e.g. from `timeout`): then run it again with the same --out.
# Store it here with: mkdir -p tests/data/<gpu>/gpu_check && tar -xzf gpu_check_data.tgz -C tests/data/<gpu>/gpu_check
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DRY=0
OUT=""
PY=""
WHEELS=""
TOPK=1
SEQS=""
BUDGET=420
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --out) OUT="$2"; shift ;;
        --python) PY="$2"; shift ;;
        --wheels) WHEELS="$2"; shift ;;
        --top-k) TOPK="$2"; shift ;;
        --seqs) SEQS="$2"; shift ;;
        --budget) BUDGET="$2"; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
        *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
for n in "TOPK=$TOPK" "BUDGET=$BUDGET" ${SEQS:+"SEQS=${SEQS// /}"}; do
    case "${n#*=}" in ''|*[!0-9]*) echo "gpu_check: ${n%%=*} must be positive integers, got ${n#*=}" >&2; exit 2 ;; esac
done
[ "$TOPK" -ge 1 ] || { echo "gpu_check: --top-k must be ≥ 1" >&2; exit 2; }
if [ -z "$PY" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY="$(command -v python3)"; fi
fi
if [ -z "$OUT" ]; then OUT="$(mktemp -d "${TMPDIR:-/tmp}/ampe-gpu-check.XXXXXX")"; fi
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
DATA="$OUT/data"
T0=$(date +%s)
say() { echo "gpu_check [$(( $(date +%s) - T0 )) s]: $*" >&2; }

# On any stop (a failed step, SIGTERM from `timeout`, Ctrl-C): pack what is stored, so a lent machine hands it back.
STARTED=0
finish() {
    local rc=$?
    if [ "$rc" -ne 0 ] && [ "$STARTED" = 1 ]; then
        "$PY" "$ROOT/benchmarks/support/gpu_check_summary.py" "$DATA" > "$OUT/summary.md" 2>/dev/null || true
        tar -czf "$OUT/gpu_check_data.tgz" -C "$DATA" . 2>/dev/null || true
        say "stopped (exit $rc); what is stored is in $OUT/gpu_check_data.tgz; run again with --out $OUT to continue"
    fi
}
trap finish EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# fresh OUTPUT KEY [INPUT...]: OUTPUT exists, was made with KEY (the arguments that made it, kept in $OUT/keys) and
# is newer than every INPUT. made OUTPUT KEY: records KEY once OUTPUT is complete.
mkdir -p "$OUT/keys"
fresh() {
    local out="$1" key="$OUT/keys/$(basename "$1")" i
    [ -f "$out" ] && [ -f "$key" ] && [ "$(cat "$key")" = "$2" ] || return 1
    shift 2
    for i in "$@"; do [ "$out" -nt "$i" ] || return 1; done
}
made() { printf '%s' "$2" > "$OUT/keys/$(basename "$1")"; }
# put FILE: standard input into FILE, leaving FILE (and its time) alone when it already says the same
put() { local t; t="$(mktemp "$1.XXXXXX")"; cat > "$t"; if cmp -s "$t" "$1"; then rm -f "$t"; else mv "$t" "$1"; fi; }

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

# --- the configuration ------------------------------------------------------------------------------------------
mkdir -p "$DATA" "$OUT/models" "$OUT/work"
if [ "$DRY" = 1 ]; then
    export DS_ACCELERATOR=cpu
    DEVICE=cpu; BASE=llama-tiny; SEQS="${SEQS:-128}"; MBS=1,2; GBS=4; BLOCKS=2; WARMUP=2; ITERS=2
    PROFILE_ARGS=(--warmup 1 --repeats 2)
    ENERGY_eager=(); ENERGY_flash=(--modelled-energy)  # the GPU run's columns: energy on the flash rows only
else
    DEVICE=cuda; BASE=llama-3.2-1b; SEQS="${SEQS:-4096}"; MBS=1,2,4; GBS=8; BLOCKS=""; WARMUP=2; ITERS=3
    PROFILE_ARGS=(--warmup 2 --repeats 5)  # the record's settings: the budget's pace holds for them
    # NVML's per-layer energy window (0.5 s each) only for the flash rows, whose plans the energy checks read
    ENERGY_eager=(--no-energy); ENERGY_flash=()
    [ -f "$DATA/nvidia_smi_before.csv" ] || nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.applications.graphics,power.limit,enforced.power.limit \
        --format=csv > "$DATA/nvidia_smi_before.csv" 2>&1 || true  # the first call's: the settings before any
fi
LONG="$(tr ' ' '\n' <<< "$SEQS" | sort -n | tail -1)"
# Expandable segments (Strategy.expandable_segments, `ampe search --expandable-segments on|off`) come with the
# footprint work; until this ampe has the flag the on/off pair is left out, and the check says so.
ES=0
search_help="$("${AMPE[@]}" search --help)"  # read whole: `| grep -q` would end it early, and pipefail say no
[[ "$search_help" == *--expandable-segments* ]] && ES=1
PLANS="flash_none flash_full eager_none eager_full"
[ "$ES" = 1 ] && PLANS="$PLANS flash_none_es_on"

GPU="$("$PY" - "$DATA/environment.json" "$DEVICE" <<'EOF'
import json, platform, sys
import deepspeed, torch
gpu = "cpu"
if sys.argv[2] == "cuda":
    from ampe.profiling.profiler import catalog_gpu_name
    gpu = catalog_gpu_name(torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).total_memory)
env = {"gpu": gpu, "torch": torch.__version__, "deepspeed": deepspeed.__version__,
       "python": platform.python_version(), "cuda": torch.version.cuda,
       "device_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}
json.dump(env, open(sys.argv[1], "w"), indent=1)
print(gpu)
EOF
)"
for seq in $SEQS; do
    { echo "name: ${BASE}-s$seq"; echo "base: $BASE"; echo "seq_len: $seq";
      [ -n "$BLOCKS" ] && echo "layers: $BLOCKS"; } | put "$OUT/models/s$seq.yaml"
done
printf 'name: one-%s\nnodes:\n  - {name: node0, gpu: %s, count: 1, intra_gbps: 3600, inter_gbps: 100}\n' "$GPU" "$GPU" \
    | put "$OUT/cluster.yaml"
MODEL="$OUT/models/s$LONG.yaml"
PROFILE="$DATA/profile_s$LONG.csv"

# --- what each step makes, and the arguments it is made with (a later call reuses what is fresh) ----------------
set_profile_args() {  # set_profile_args SEQ KERNEL: ARGS of its `ampe profile`
    local e="ENERGY_$2[@]"
    ARGS=(--model "$OUT/models/s$1.yaml" --device "$DEVICE" --attention "$2" --recompute none,full --mbs "$MBS"
          --identical-layers once "${PROFILE_ARGS[@]}" "${!e}")
}
profile_csv() { echo "$OUT/work/profile_s$1_$2.csv"; }
profile_fresh() { set_profile_args "$1" "$2"; fresh "$(profile_csv "$1" "$2")" "${ARGS[*]}"; }
set_plan_args() {  # set_plan_args NAME: ARGS of its `ampe search`; one plan per attention × recomputation (× ES)
    local att="${1%%_*}" rest="${1#*_}"
    ARGS=(--cluster "$OUT/cluster.yaml" --model "$MODEL" --profile "$PROFILE" --attention "$att"
          --recompute "${rest%%_*}" --zero 0 --global-batch "$GBS" --top-k 4)
    if [ "$ES" = 1 ]; then case "$1" in *_es_on) ARGS+=(--expandable-segments on) ;;
                                        *) ARGS+=(--expandable-segments off) ;; esac; fi
}
plan_fresh() { set_plan_args "$1"; fresh "$OUT/work/plan_$1.json" "${ARGS[*]}" "$PROFILE" "$MODEL" "$OUT/cluster.yaml"; }
plan_k() { if [ "$1" = flash_none ]; then echo "$TOPK"; else echo 1; fi; }
EXPORT_KEY="export $WARMUP $ITERS"
export_fresh() { fresh "$DATA/user_script.json" "$EXPORT_KEY" "$OUT/work/plan_flash_none.json"; }

# --- the estimate, before anything is measured --------------------------------------------------------------------
gpu_steps() {  # the steps left: what this call will run, and the trials it will not run again
    local seq att name
    echo setup
    for seq in $SEQS; do for att in eager flash; do
        profile_fresh "$seq" "$att" || echo "profile:$att$([ "$seq" = "$LONG" ] || echo ":$seq")"
    done; done
    echo merge
    for name in $PLANS; do
        if plan_fresh "$name"; then echo "trial:$name:$(plan_k "$name"):$OUT/work/trials_$name"
        else echo "plan:$name"; echo "trial:$name:$(plan_k "$name")"; fi
    done
    export_fresh || echo export
}
mapfile -t STEPS < <(gpu_steps)  # one a line: a folder may hold spaces
est="$("$PY" "$ROOT/benchmarks/support/gpu_check_budget.py" --budget "$BUDGET" "${STEPS[@]}")"
if [ "$DRY" = 1 ]; then
    say "dry run: the estimate above is for these steps on a GPU (Llama-3.2-1B, seq 4096); this CPU runs llama-tiny"
elif [ "$est" -gt "$BUDGET" ]; then
    echo "gpu_check: the estimate ($est s) exceeds the budget ($BUDGET s); nothing was run (fewer --seqs or" \
         "--top-k, or a larger --budget)" >&2
    exit 2
fi
STARTED=1
[ "$ES" = 1 ] || say "expandable segments on/off left out: this ampe's search has no --expandable-segments yet"
cp "$OUT"/models/*.yaml "$OUT/cluster.yaml" "$DATA/"
say "device $GPU ($DEVICE); models: $BASE at seq ${SEQS// /, }; plans: $PLANS"

# --- 1. profile: each sequence length, both kernels, recomputation none and full; merged by ampe ----------------
for seq in $SEQS; do
    for att in eager flash; do
        csv="$(profile_csv "$seq" "$att")"
        if profile_fresh "$seq" "$att"; then say "profile seq $seq $att: reused $csv"; continue; fi
        "${AMPE[@]}" profile "${ARGS[@]}" --out "$csv" >&2  # written atomically: present means complete
        made "$csv" "${ARGS[*]}"
        say "profiled seq $seq $att"
    done
    inputs=("$(profile_csv "$seq" eager)" "$(profile_csv "$seq" flash)")
    if ! fresh "$DATA/profile_s$seq.csv" merge "${inputs[@]}"; then
        "${AMPE[@]}" profile --merge "${inputs[@]}" --out "$DATA/profile_s$seq.csv" >&2
        made "$DATA/profile_s$seq.csv" merge
    fi
done

# --- 2. search and 3. trials: one plan per attention × recomputation (× expandable segments) at the long sequence -
for name in $PLANS; do
    plan="$OUT/work/plan_$name.json"
    trials="$OUT/work/trials_$name"
    if ! plan_fresh "$name"; then
        "${AMPE[@]}" search "${ARGS[@]}" --out "$plan" > "$OUT/work/search_$name.txt"
        made "$plan" "${ARGS[*]}"
        rm -rf "$trials"  # measured for another plan
    fi
    k="$(plan_k "$name")"
    # resumes: the finished trials of results.jsonl are kept. An OOM or crash is a finding, recorded there: `ampe
    # trial` exits 1 when nothing ran ok
    "${AMPE[@]}" trial --plan "$plan" --out "$trials" --top-k "$k" --freq-backend none --warmup "$WARMUP" \
        --iters "$ITERS" --timeout 300 --run-unfit >&2 || say "plan $name: no trial ran ok (recorded)"
    "${AMPE[@]}" report "$trials" --json "$OUT/work/report_$name.json" > "$OUT/work/report_$name.txt"
    cp "$trials/results.jsonl" "$DATA/trials_$name.jsonl"
    say "plan $name: $k trial(s)"
done

# --- 4. export the best flash strategy and train it from a user script under the exported plan ------------------
if export_fresh; then
    say "exported plan rank 1: reused its run ($DATA/user_script.json)"
else
    rm -rf "$OUT/work/export"
    "${AMPE[@]}" export --plan "$OUT/work/plan_flash_none.json" --rank 1 --out "$OUT/work/export" \
        --script "$ROOT/benchmarks/support/train_exported.py" --master-port 29517 > "$OUT/work/export.txt"
    (cd "$OUT/work/export" && /bin/sh ./launch.sh --warmup "$WARMUP" --iters "$ITERS" --report "$DATA/user_script.json") >&2
    cp "$OUT/work/export/measurements.jsonl" "$DATA/user_measurements.jsonl"
    cp "$OUT/work/export/ds_config.json" "$DATA/export_ds_config.json"
    "${AMPE[@]}" report --measurements "$DATA/user_measurements.jsonl" --cluster "$OUT/cluster.yaml" --model "$MODEL" \
        --profile "$PROFILE" > "$OUT/work/report_user.txt"
    made "$DATA/user_script.json" "$EXPORT_KEY"
    say "exported plan rank 1 trained by the user script"
fi

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
