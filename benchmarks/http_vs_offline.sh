#!/usr/bin/env bash
# W1 through HTTP streaming (32 concurrent clients, `modelcall bench serve`) against the offline W1
# (the `modelcall bench throughput` protocol), on the same freshly built reference model, in one run.
# Target: HTTP >= 0.9x offline.
#   benchmarks/http_vs_offline.sh          THREADS=2 PAIRS=4
# Both are measured on ONE warm kernel that also serves the HTTP app (see http_vs_offline.py), runs
# alternating, so the only difference is the front end and its client. (Separate server and bench
# processes were tried first: on this shared 2-core machine the same comparison swung from 0.78x to
# 1.19x between two runs minutes apart, which says nothing about the front end.)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
shared=${SHARED_DIR:-$repo/../shared}
py=${PYTHON:-$repo/.venv/bin/python}
export OMP_WAIT_POLICY=PASSIVE
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

"$py" "$shared/bench/make_reference_model.py" "$scratch" --size w1 >/dev/null 2>&1
"$py" "$repo/benchmarks/http_vs_offline.py" "$scratch/model" "$scratch/w1.jsonl" --threads "${THREADS:-2}" \
  --pairs "${PAIRS:-4}" 2> >(grep -v -E "Loading weights|INFO" >&2)
