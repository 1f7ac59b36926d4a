#!/usr/bin/env bash
# Issue 16's device check: one prepared run for a GPU machine with no network (docs/gpu.md).
#
#   scripts/device_check.sh OUT_DIR [WHEEL_DIR]          # on the GPU machine (WHEEL_DIR default: .whl)
#   scripts/device_check.sh --dry-run OUT_DIR [WHEEL_DIR] # the same stages on CPU with tiny sizes (DEVICE=cpu too)
#
# Stages, each bounded by `timeout` so the whole stays under 8 minutes (30 + 150 + 300 s; STAGE_*_S override):
#   install  the carried wheels (project, msgspec, llguidance, ...) into a target dir put on PYTHONPATH;
#            skipped when WHEEL_DIR has no wheels (a dev checkout where modelcall is already importable)
#   tests    pytest -m gpu (tests/test_gpu.py), its report in OUT_DIR/gpu_tests.xml
#   figures  benchmarks/gpu_figures.py -> OUT_DIR/figures.json
# OUT_DIR/stages.json lists each stage with its exit status and seconds; OUT_DIR/device_check.log holds
# everything printed. At most 5 files are written to OUT_DIR (the device tool returns at most 8).
# FIGURES_ARGS: extra arguments for gpu_figures.py (e.g. "--skip transformers").
set -u
DRY=0
[ "${DEVICE:-}" = cpu ] && DRY=1
if [ "${1:-}" = --dry-run ]; then DRY=1; shift; fi
OUT=${1:?usage: scripts/device_check.sh [--dry-run] OUT_DIR [WHEEL_DIR]}
WHEELS=${2:-.whl}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
[ -x "$ROOT/.venv/bin/python" ] && [ -z "${PYTHON:-}" ] && [ $DRY = 1 ] && PY="$ROOT/.venv/bin/python"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG="$OUT/device_check.log"
: >"$LOG"
export PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=PASSIVE
if [ $DRY = 1 ]; then
  export CUDA_VISIBLE_DEVICES="" DEVICE=cpu OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  T_INSTALL=${STAGE_INSTALL_S:-60} T_TESTS=${STAGE_TESTS_S:-60} T_FIGURES=${STAGE_FIGURES_S:-120}
  FIG_FLAGS="--dry-run"
else
  # 8 minutes in all: 30 s install (3 s rehearsed), 150 s GPU tests (Triton compiles its kernel variants),
  # 300 s figures (model build, attention candidates, decode, decode with graphs, TTFT, generate_batch, parity)
  T_INSTALL=${STAGE_INSTALL_S:-30} T_TESTS=${STAGE_TESTS_S:-150} T_FIGURES=${STAGE_FIGURES_S:-300}
  FIG_FLAGS=""
fi
STAGES=()

stage() {  # stage NAME SECONDS CMD...: runs CMD under timeout, appends its line to stages.json
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS rc
  echo "== stage $name (limit ${limit}s): $*" | tee -a "$LOG"
  timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
  rc=$?
  echo "== stage $name rc=$rc in $((SECONDS - t0))s" | tee -a "$LOG"
  STAGES+=("{\"name\": \"$name\", \"rc\": $rc, \"seconds\": $((SECONDS - t0)), \"limit_s\": $limit, \"timed_out\": $([ $rc = 124 ] || [ $rc = 137 ] && echo true || echo false)}")
  write_stages
}

write_stages() {
  local IFS=,
  printf '{"dry_run": %s, "stages": [%s]}\n' "$([ $DRY = 1 ] && echo true || echo false)" "${STAGES[*]}" >"$OUT/stages.json"
}

cd "$ROOT"
shopt -s nullglob
whl=("$WHEELS"/*.whl)
if [ ${#whl[@]} -gt 0 ]; then
  SITE=${SITE_DIR:-/tmp/modelcall-site}
  stage install "$T_INSTALL" "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "${whl[@]}"
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
else
  echo "== no wheels in $WHEELS: using the modelcall importable here" | tee -a "$LOG"
  STAGES+=("{\"name\": \"install\", \"rc\": 0, \"seconds\": 0, \"limit_s\": 0, \"timed_out\": false, \"skipped\": true}")
fi
"$PY" -c "import modelcall.core, torch; print('modelcall from', modelcall.core.__file__, '| torch', torch.__version__, '| cuda', torch.cuda.is_available())" 2>&1 | tee -a "$LOG"

# the tests run from the checkout (tests/ is not in the wheel); -p no:cacheprovider: nothing written here
stage tests "$T_TESTS" "$PY" -m pytest -q -p no:cacheprovider -m gpu --junitxml="$OUT/gpu_tests.xml" tests/test_gpu.py
# shellcheck disable=SC2086  # FIG_FLAGS / FIGURES_ARGS are word lists
stage figures "$T_FIGURES" "$PY" benchmarks/gpu_figures.py $FIG_FLAGS ${FIGURES_ARGS:-} --out "$OUT/figures.json"
write_stages
echo "== done: $OUT" | tee -a "$LOG"
cat "$OUT/stages.json"
[ -f "$OUT/figures.json" ] && tail -n 12 "$LOG"
exit 0
