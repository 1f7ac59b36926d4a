#!/usr/bin/env bash
# W1 through `modelcall bench throughput` with the whole tree of an earlier commit and of a later one, runs
# alternating (A B A B ...), so the machine's noise hits both alike; prints each run's tok/s and tokens per
# process CPU-second, then the medians and their ratios.
#
#   OMP_WAIT_POLICY=PASSIVE benchmarks/w1_before_after.sh BASE [NEW=HEAD]
#       env: MODEL, DATASET (default /tmp/s3/ref/{model,w1.jsonl}), THREADS (1), ROUNDS (3), RUNS (3: per invocation),
#            PIN (default "taskset -c 0" with one thread, nothing with more; PIN= to turn it off)
#
# Each side is a detached git worktree of its commit, imported ahead of the editable install through PYTHONPATH
# (a `modelcall` package whose core/events/plugins/testing link into the worktree); uncommitted edits take no part.
set -euo pipefail
BASE=${1:?usage: $0 BASE [NEW]}
NEW=${2:-HEAD}
REPO=$(cd "$(dirname "$0")/.." && pwd)
MODEL=${MODEL:-/tmp/s3/ref/model}
DATASET=${DATASET:-/tmp/s3/ref/w1.jsonl}
THREADS=${THREADS:-1}
ROUNDS=${ROUNDS:-3}
RUNS=${RUNS:-3}
if [ -z "${PIN+x}" ]; then PIN=$([ "$THREADS" = 1 ] && echo "taskset -c 0" || echo ""); fi
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
WORK=$(mktemp -d)
cleanup() { for s in a b; do git -C "$REPO" worktree remove --force "$WORK/wt_$s" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

side() {   # side NAME COMMIT: worktree + import root
  git -C "$REPO" worktree add --detach "$WORK/wt_$1" "$2" >/dev/null 2>&1
  mkdir -p "$WORK/pp_$1/modelcall"
  touch "$WORK/pp_$1/modelcall/__init__.py"
  for d in core events plugins testing; do ln -s "$WORK/wt_$1/$d" "$WORK/pp_$1/modelcall/$d"; done
}
side a "$BASE"
side b "$NEW"
echo "A = $(git -C "$REPO" rev-parse --short "$BASE"), B = $(git -C "$REPO" rev-parse --short "$NEW"); threads $THREADS; $ROUNDS rounds of $RUNS runs; pin: ${PIN:-none}"

for r in $(seq "$ROUNDS"); do
  for s in a b; do
    PYTHONPATH="$WORK/pp_$s" $PIN "$REPO/.venv/bin/modelcall" bench throughput --model "$MODEL" --dataset "$DATASET" \
      --runs "$RUNS" --threads "$THREADS" --dtype bfloat16 --concurrency "" 2>&1 | grep '^run ' | sed "s/^/$s /" \
      | tee -a "$WORK/runs.txt"
  done
done

python3 - "$WORK/runs.txt" <<'EOF'
import re, statistics, sys
rows = {"a": [], "b": []}
for line in open(sys.argv[1]):
    m = re.match(r"(\w) run \d+: (\d+) tokens in ([\d.]+) s = ([\d.]+) tok/s.*process CPU ([\d.]+) s", line)
    if m:
        side, tok, wall, tps, cpu = m.groups()
        rows[side].append((float(tps), int(tok) / float(cpu)))
med = {s: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v)) for s, v in rows.items()}
print(f"A: {med['a'][0]:.1f} tok/s, {med['a'][1]:.1f} tok per CPU-s  ({len(rows['a'])} runs)")
print(f"B: {med['b'][0]:.1f} tok/s, {med['b'][1]:.1f} tok per CPU-s  ({len(rows['b'])} runs)")
print(f"B / A: {med['b'][0] / med['a'][0]:.3f}x wall, {med['b'][1] / med['a'][1]:.3f}x per CPU-second")
EOF
