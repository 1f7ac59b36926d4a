#!/usr/bin/env bash
# Entry overhead per request, this tree vs a baseline tree (e.g. a git worktree of an older commit),
# same script, alternating runs, one process each; prints each run and new/base ratios of the medians over
# runs of: CPU time per submit (the figure to read on a loaded machine), wall p10, wall median.
#   git worktree add /tmp/mc_base <commit>
#   benchmarks/entry_overhead.sh /tmp/mc_base          N=200 PAIRS=2
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
base=${1:?usage: entry_overhead.sh BASELINE_TREE}
py=${PYTHON:-$repo/.venv/bin/python}
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# Each tree is imported through a modelcall/ namespace folder of links to it (found before the
# editable install's finder; see scripts/scratch_copy.sh).
for which in new base; do
  tree=$([ "$which" = new ] && echo "$repo" || echo "$base")
  mkdir -p "$scratch/$which/modelcall"
  for part in core events plugins testing; do ln -sfn "$tree/$part" "$scratch/$which/modelcall/$part"; done
done
# One model for both: the baseline tree's demo model, written once (MODEL_DIR=... to use another).
if [ -z "${MODEL_DIR:-}" ]; then
  export MODEL_DIR="$scratch/model"
  PYTHONPATH="$scratch/base" "$py" -c "import sys; from modelcall.plugins.demo_model.build import write_demo_model; \
write_demo_model(sys.argv[1])" "$MODEL_DIR" >/dev/null 2>&1
fi
results="$scratch/results.jsonl"
for _ in $(seq "${PAIRS:-2}"); do
  for which in base new; do
    PYTHONPATH="$scratch/$which" "$py" "$repo/benchmarks/entry_overhead.py" "${N:-200}" 2>/dev/null | tee -a "$results"
  done
done
"$py" - "$results" "$repo" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
new = [r for r in rows if r["tree"] == sys.argv[2]]
old = [r for r in rows if r["tree"] != sys.argv[2]]
for form in ("text", "messages", "token_ids"):
    for stat in ("cpu_median_us", "p10_us", "median_us"):
        n = statistics.median(r[form][stat] for r in new)
        o = statistics.median(r[form][stat] for r in old)
        print(f"{form:10s} {stat:14s} base {o:8.1f} us   new {n:8.1f} us   new/base {n / o:5.2f}x")
PY
