#!/usr/bin/env bash
# benchmarks/gpu.sh [--dry-run] [--headline] [--out DIR] [--budget SECONDS] [--bundle DIR]
#
# The GPU figures of the README in one run on one GPU (sized for an H200 in under 10 minutes),
# most wanted first, so that a run cut short by its budget still brings the headline figures:
#   1. shared vs isolated for the demo scenario with 3 RL iterations a tenant
#      (benchmarks/multi_tenant.py, gpu-2b, roles as processes: the device host on one core, the
#      optimizer on another, the rest on the others);
#   2. group batching, bf16: tenants {1,2,4,8} x local batch {1,2,4,8}, grouped vs separate
#      forwards, for the gpu-2b preset (benchmarks/group_batching.py);
#   3. the projection model (benchmarks/projection.py) replaying those traces with gpu-2b forwards
#      (this run's table, else the one measured on 2026-12-04);
#   4. tenant-slot memory on the device, measured with torch.cuda.max_memory_allocated /
#      memory_allocated for one more tenant (benchmarks/tenant_memory.py --device cuda);
#   5. the group-batching table of gpu-1b and gpu-4b;
#   then results.json + results.md in the output folder (benchmarks/gpu_summary.py).
# --headline runs only 1 and 3 (with the 2026-12-04 table): for a short lease.
#
# --dry-run does the same on the CPU with the tiny preset (fp32, 1 repeat, the smoke scenario
# without ManiSkill, a 2x2 corner of the batching grid): the test suite runs it
# (tests/test_gpu_script.py).
#
# Prerequisites, either: `make setup` has run (the .venv and the Kafka jars); or, on a GPU machine
# with no network and no Java whose python3 has torch and transformers: --bundle DIR, a folder
# made beforehand by `python -m benchmarks.gpu_bundle` (the missing wheels, a Java runtime and
# the broker's jars), unpacked into a temporary folder, leaving the machine's packages alone.
# The broker is the local one (started if needed) unless JOYNEXUS_BOOTSTRAP_SERVERS points
# elsewhere. Every step has its own time limit and the whole run a budget (--budget, default
# 570 s; the multi-tenant step's own limit is $MT_LIMIT, default 480 s): a step that fails or does
# not fit is recorded as such in results.json and the others still run, so a partial run still
# brings its numbers back.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0
HEADLINE=0
OUT=""
BUDGET=570
BUNDLE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --headline) HEADLINE=1 ;;
    --out) OUT="$2"; shift ;;
    --budget) BUDGET="$2"; shift ;;
    --bundle) BUNDLE="$2"; shift ;;
    -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
if [ -n "$BUNDLE" ]; then
  [ -d "$BUNDLE/wheels" ] && [ -f "$BUNDLE/java.tar.xz" ] || { echo "gpu.sh: $BUNDLE is no bundle" \
    "(make one with: python -m benchmarks.gpu_bundle)" >&2; exit 2; }
  UNPACKED=$(mktemp -d "${TMPDIR:-/tmp}/joynexus-bundle.XXXXXX")
  "$PY" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
    --target "$UNPACKED/site" "$BUNDLE"/wheels/*.whl || { echo "gpu.sh: installing the bundle's wheels failed" >&2; exit 1; }
  tar -xJf "$BUNDLE/java.tar.xz" -C "$UNPACKED" || { echo "gpu.sh: unpacking the bundle's Java failed" >&2; exit 1; }
  export PYTHONPATH="$PWD:$UNPACKED/site${PYTHONPATH:+:$PYTHONPATH}" PATH="$UNPACKED/jre/bin:$PATH" \
    JOYNEXUS_KAFKA_CACHE="$UNPACKED/kafka"
fi
OUT=${OUT:-gpu-results/$(date -u +%Y%m%d-%H%M%S)$([ $DRY = 1 ] && echo -dry)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
STEPS="$OUT/steps.jsonl"
: > "$STEPS"
START=$(date +%s)

if [ $DRY = 1 ]; then
  DEVICE=cpu; DTYPE=float32; GB_FIRST="tiny"; GB_LATER=""; GB_REPEATS=1; GB_GRID=(--tenants 1 8 --local-batch 1 4)
  GB_THREADS=1
  MEM_PRESETS="tiny"; MEM_DEVICE=cpu
  MT_BACKBONE=tiny; MT_ARGS=(--scenario smoke --repeats 1 --no-maniskill --deployment processes --warm-up smoke)
else
  DEVICE=cuda; DTYPE=bfloat16; GB_FIRST="gpu-2b"; GB_LATER="gpu-1b gpu-4b"; GB_REPEATS=5; GB_GRID=()
  GB_THREADS=0  # torch's default: the forwards run on the GPU, no role shares the CPUs with this step
  MEM_PRESETS="gpu-1b gpu-2b gpu-4b"; MEM_DEVICE=cuda
  # 3 of the quick scenario's 8 RL iterations: at gpu-2b on an H200 a Reach iteration took 10-15 s
  # and the isolated pass alone ~400 s (benchmarks/gpu-runs/2026-12-04-h200-second/)
  MT_BACKBONE=gpu-2b; MT_ARGS=(--scenario quick --iterations 3 --repeats 1 --deployment processes --warm-up smoke)
  # ManiSkill needs its package and a Vulkan device; without them the third RL tenant runs the
  # built-in Push task (still 3 RL + 1 SFT, the paper's mix).
  "$PY" -c "import sys, mani_skill, envs.vulkan as v; sys.exit(not v.vulkan_available())" >/dev/null 2>&1 \
    || MT_ARGS+=(--builtin-third)
  # The device's work is the GPU's here, so its two host-side processes (the device host, the
  # optimizer) get a core each instead of sharing one, and the other roles the remaining cores.
  CPUS=$("$PY" -c 'import os; c = [str(i) for i in sorted(os.sched_getaffinity(0))]; print(
    f"device={c[0]},optimizer={c[1]},rest=" + "+".join(c[2:]) if len(c) > 2 else "")')
  [ -n "$CPUS" ] && MT_ARGS+=(--cpus "$CPUS")
fi
export JOYNEXUS_TORCH_THREADS=${JOYNEXUS_TORCH_THREADS:-1} HF_HUB_OFFLINE=1  # nothing is downloaded at run time

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

# The presets are built once (seeded random weights, save_pretrained) under JOYNEXUS_HOME/models:
# the multi-tenant step's now (a bf16 preset is drawn on the GPU: ~20 s for gpu-2b with its save
# on the H200; on that machine's CPU the draw took over 120 s), so that its device host, on its
# one pinned core, loads the backbone instead of drawing it.
step presets 120 env JOYNEXUS_DEVICE="$DEVICE" JOYNEXUS_DTYPE="$DTYPE" "$PY" -m infra backbone build "$MT_BACKBONE"

group_batching() {
  step "group_batching_$1" 120 "$PY" benchmarks/group_batching.py --preset "$1" --threads "$GB_THREADS" \
    --device "$DEVICE" --dtype "$DTYPE" --repeats "$GB_REPEATS" ${GB_GRID[@]+"${GB_GRID[@]}"} \
    --json "$OUT/group_batching_$1.json"
}
step multi_tenant "${MT_LIMIT:-480}" env JOYNEXUS_BACKBONE="$MT_BACKBONE" JOYNEXUS_DEVICE="$DEVICE" JOYNEXUS_DTYPE="$DTYPE" \
  "$PY" -m benchmarks.multi_tenant "${MT_ARGS[@]}" --json "$OUT/multi_tenant.json" --run-dir "$OUT/multi_tenant_run"

[ $HEADLINE = 1 ] || group_batching "$GB_FIRST"

# PROJECTION (labelled so in its output): the measured traces above replayed by the device model
# with this run's forward times of the 2B preset (tiny in a dry run).
TABLE="$OUT/group_batching_$([ $DRY = 1 ] && echo tiny || echo gpu-2b).json"
# no table of its own (its step did not fit): the one measured on an H200 on 2026-12-04
[ -f "$TABLE" ] || [ $DRY = 1 ] || TABLE=benchmarks/gpu-runs/2026-12-04-h200/group_batching_gpu-2b.json
if [ -f "$OUT/multi_tenant_run/traces.json" ] && [ -f "$TABLE" ]; then
  step projection 30 "$PY" -m benchmarks.projection "$OUT/multi_tenant_run" --gpu-table "$TABLE" \
    --json "$OUT/projection.json"
else
  echo '{"name": "projection", "status": "skipped", "reason": "needs the multi_tenant traces and the batching table"}' >> "$STEPS"
fi

[ $HEADLINE = 1 ] || step tenant_memory 60 "$PY" benchmarks/tenant_memory.py --presets $MEM_PRESETS --device "$MEM_DEVICE" \
  --json "$OUT/tenant_memory.json"

[ $HEADLINE = 1 ] || for preset in $GB_LATER; do group_batching "$preset"; done

"$PY" benchmarks/gpu_summary.py "$OUT"
echo "results: $OUT/results.md, $OUT/results.json (total $(( $(date +%s) - START ))s)"
