#!/usr/bin/env bash
# The decode attention kernel alone, from C (benchmarks/decode_kernel.c), today's source against another commit's,
# alternating runs in one script: what the kernel's own memory traffic costs, without Python or the model around it.
#   benchmarks/decode_kernel.sh [BASE_REV]   (default: HEAD~1)
# Environment: SHAPES ("32x192 16x2048": rows x context), LAYERS=8, ROUNDS=3, RUN_SECONDS=2 per run, NT=1 (threads;
# pinned to CPUs 0..NT-1), CFLAGS_EXTRA (e.g. "-DPF_DECODE=2", or "-mno-avx512f" for the AVX2 kernels), QF32=1,
# KVT=2 (fp8 E4M3 cache; 3: E5M2), HUGE=0 (4 KB pages; by default the caches are on transparent huge pages, as the
# modelcall command puts torch's large allocations).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$repo/.venv/bin/python}
base=${1:-HEAD~1}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
source_at() {   # REV OUT: cpu_kernel.SOURCE as of REV (the working tree for "now")
  if [ "$1" = now ]; then (cd "$repo" && "$py" -c "from modelcall.plugins.runner import cpu_kernel; print(cpu_kernel.SOURCE)") > "$2"
  else
    mkdir -p "$scratch/$1/modelcall" && git -C "$repo" archive "$1" plugins/runner core/native.py | tar -x -C "$scratch/$1/modelcall"
    (cd "$scratch/$1" && PYTHONPATH=. "$py" -c "
import importlib.util, sys, types
pkg = types.ModuleType('modelcall'); pkg.__path__ = ['modelcall']; sys.modules['modelcall'] = pkg
for name in ('core', 'plugins', 'plugins.runner'):
    m = types.ModuleType('modelcall.' + name); m.__path__ = ['modelcall/' + name.replace('.', '/')]; sys.modules['modelcall.' + name] = m
from modelcall.plugins.runner import cpu_kernel; print(cpu_kernel.SOURCE)") > "$2"
  fi
}
for side in now "$base"; do
  source_at "$side" "$scratch/$side.c"
  gcc -O3 -march=native -ffast-math -fopenmp ${CFLAGS_EXTRA:-} -include "$scratch/$side.c" "$repo/benchmarks/decode_kernel.c" \
    -o "$scratch/$side.bin" -lm
done
nt=${NT:-1}
echo "decode kernel: today vs $base, ${LAYERS:-8} layers, threads $nt, CFLAGS_EXTRA='${CFLAGS_EXTRA:-}'"
for shape in ${SHAPES:-32x192 16x2048}; do
  for _ in $(seq "${ROUNDS:-3}"); do
    for side in "$base" now; do
      NT=$nt OMP_NUM_THREADS=$nt OMP_WAIT_POLICY=PASSIVE taskset -c 0-$((nt - 1)) "$scratch/$side.bin" ${shape%x*} ${shape#*x} \
        "${LAYERS:-8}" 0 "${RUN_SECONDS:-2}" "$([ "$side" = now ] && echo today || echo "$base")"
    done
  done
done
