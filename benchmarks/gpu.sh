#!/usr/bin/env bash
# benchmarks/gpu.sh [--dry-run] [--out DIR] [--budget SECONDS]
#
# The GPU figures of the README in one run on one GPU (sized for an H200 in < 8 minutes):
#   1. group batching, bf16: tenants {1,2,4,8} x local batch {1,2,4,8}, grouped vs separate
#      forwards, for the gpu-1b / gpu-2b / gpu-4b presets (benchmarks/group_batching.py);
#   2. tenant-slot memory on the device, measured with torch.cuda.max_memory_allocated /
#      memory_allocated for one more tenant (benchmarks/tenant_memory.py --device cuda);
#   3. shared vs isolated for the demo scenario on the GPU (benchmarks/multi_tenant.py, gpu-1b);
#   4. the projection model (benchmarks/projection.py) replaying those traces with gpu-2b forwards;
#   then results.json + results.md in the output folder (benchmarks/gpu_summary.py).
#
# --dry-run does the same on the CPU with the tiny preset (fp32, 1 repeat, the smoke scenario
# without ManiSkill, a 2x2 corner of the batching grid): the test suite runs it
# (tests/test_gpu_script.py).
#
# Prerequisites: `make setup` has run (the .venv and the Kafka jars; the GPU machine needs no
# network then). The broker is the local one (started if needed) unless
# JOYNEXUS_BOOTSTRAP_SERVERS points elsewhere. Every step has its own time limit and the whole
# run a budget (--budget, default 450 s): a step that fails or does not fit is recorded as such
# in results.json and the others still run, so a partial run still brings its numbers back.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0
OUT=""
BUDGET=450
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --out) OUT="$2"; shift ;;
    --budget) BUDGET="$2"; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-gpu-results/$(date -u +%Y%m%d-%H%M%S)$([ $DRY = 1 ] && echo -dry)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
STEPS="$OUT/steps.jsonl"
: > "$STEPS"
START=$(date +%s)

if [ $DRY = 1 ]; then
  DEVICE=cpu; DTYPE=float32; GB_PRESETS="tiny"; GB_REPEATS=1; GB_GRID=(--tenants 1 8 --local-batch 1 4)
  MEM_PRESETS="tiny"; MEM_DEVICE=cpu
  MT_BACKBONE=tiny; MT_ARGS=(--scenario smoke --repeats 1 --no-maniskill)
else
  DEVICE=cuda; DTYPE=bfloat16; GB_PRESETS="gpu-1b gpu-2b gpu-4b"; GB_REPEATS=5; GB_GRID=()
  MEM_PRESETS="gpu-1b gpu-2b gpu-4b"; MEM_DEVICE=cuda
  MT_BACKBONE=gpu-1b; MT_ARGS=(--scenario quick --repeats 1)
  # ManiSkill needs a Vulkan device; without one the scenario runs without the PushCube tenant.
  "$PY" -c "import sys, envs.vulkan as v; sys.exit(not v.vulkan_available())" >/dev/null 2>&1 || MT_ARGS+=(--no-maniskill)
fi
export JOYNEXUS_TORCH_THREADS=${JOYNEXUS_TORCH_THREADS:-1}

# step NAME LIMIT_S COMMAND...: runs COMMAND with stdout in NAME.md and stderr in NAME.log,
# unless the budget has less than LIMIT_S left; records {name, status, seconds, rc} in steps.jsonl.
step() {
  local name=$1 limit=$2; shift 2
  local left=$(( BUDGET - ($(date +%s) - START) ))
  if [ "$left" -lt "$limit" ]; then
    echo "{\"name\": \"$name\", \"status\": \"skipped\", \"reason\": \"budget: ${left}s left, needs ${limit}s\"}" >> "$STEPS"
    echo "== $name: skipped (budget: ${left}s left, needs ${limit}s)"
    return
  fi
  echo "== $name (limit ${limit}s)"
  local began=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.md" 2> "$OUT/$name.log"
  local rc=$? took=$(( $(date +%s) - began ))
  local status=ok
  [ $rc -eq 0 ] || status=failed
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && status=timeout
  echo "{\"name\": \"$name\", \"status\": \"$status\", \"rc\": $rc, \"seconds\": $took}" >> "$STEPS"
  echo "   $status in ${took}s"
  tail -n 40 "$OUT/$name.md"
}

step environment 60 "$PY" -c "
import json, platform, torch, transformers
info = {'python': platform.python_version(), 'torch': torch.__version__,
        'transformers': transformers.__version__, 'cuda': torch.cuda.is_available(),
        'device': torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or 'cpu',
        'cpus': __import__('os').cpu_count(), 'dry_run': $DRY}
open('$OUT/environment.json', 'w').write(json.dumps(info, indent=2)); print(json.dumps(info))
if not $DRY and not torch.cuda.is_available(): raise SystemExit('no CUDA device: run with --dry-run on a CPU')
"
if ! grep -q '"name": "environment", "status": "ok"' "$STEPS"; then
  cat "$OUT/environment.log" >&2
  echo "gpu.sh: the environment check failed (see above); nothing else was run" >&2
  exit 1
fi

# The presets are built once (seeded random weights, save_pretrained) under JOYNEXUS_HOME/models.
for preset in $GB_PRESETS; do
  step "group_batching_$preset" 150 "$PY" benchmarks/group_batching.py --preset "$preset" \
    --device "$DEVICE" --dtype "$DTYPE" --repeats "$GB_REPEATS" ${GB_GRID[@]+"${GB_GRID[@]}"} \
    --json "$OUT/group_batching_$preset.json"
done

step tenant_memory 90 "$PY" benchmarks/tenant_memory.py --presets $MEM_PRESETS --device "$MEM_DEVICE" \
  --json "$OUT/tenant_memory.json"

step multi_tenant 240 env JOYNEXUS_BACKBONE="$MT_BACKBONE" JOYNEXUS_DEVICE="$DEVICE" JOYNEXUS_DTYPE="$DTYPE" \
  "$PY" -m benchmarks.multi_tenant "${MT_ARGS[@]}" --json "$OUT/multi_tenant.json" --run-dir "$OUT/multi_tenant_run"

# PROJECTION (labelled so in its output): the measured traces above replayed by the device model
# with this run's forward times of the 2B preset (tiny in a dry run).
TABLE="$OUT/group_batching_$([ $DRY = 1 ] && echo tiny || echo gpu-2b).json"
if [ -f "$OUT/multi_tenant_run/traces.json" ] && [ -f "$TABLE" ]; then
  step projection 60 "$PY" -m benchmarks.projection "$OUT/multi_tenant_run" --gpu-table "$TABLE" \
    --json "$OUT/projection.json"
else
  echo '{"name": "projection", "status": "skipped", "reason": "needs the multi_tenant traces and the batching table"}' >> "$STEPS"
fi

"$PY" benchmarks/gpu_summary.py "$OUT"
echo "results: $OUT/results.md, $OUT/results.json (total $(( $(date +%s) - START ))s)"
