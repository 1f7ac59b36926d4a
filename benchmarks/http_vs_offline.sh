#!/usr/bin/env bash
# W1 through HTTP streaming (32 concurrent clients, `modelcall bench serve` against `modelcall serve`)
# against the offline W1 (`modelcall bench throughput`), on the same freshly built reference model,
# same torch threads, in one run. Target: HTTP >= 0.9x offline.
#   benchmarks/http_vs_offline.sh          THREADS=2 NRUNS=4
# The two are interleaved in pairs whose order alternates (offline-HTTP, HTTP-offline, ...) so load
# drifting on a shared machine falls on both alike; printed: each side's median, their ratio, and
# the median of the per-pair ratios.
# NOTE: the server runs with --no-prefix-caching: W1 repeats its prompts run after run, and cache hits
# would flatter the HTTP figure (the offline bench resets its prefix cache before each run instead).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
shared=${SHARED_DIR:-$repo/../shared}
py=${PYTHON:-$repo/.venv/bin/python}
mc=$repo/.venv/bin/modelcall
threads=${THREADS:-2}
runs=${NRUNS:-4}
export OMP_WAIT_POLICY=PASSIVE
scratch=$(mktemp -d)
server=""
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$scratch"; }
trap cleanup EXIT

"$py" "$shared/bench/make_reference_model.py" "$scratch" --size w1 >/dev/null
data="$scratch/w1.jsonl"

"$mc" serve --model "$scratch/model" --threads "$threads" --port 0 --no-prefix-caching --ledger off \
  >"$scratch/serve.out" 2>"$scratch/serve.log" &
server=$!
for _ in $(seq 600); do grep -q "serving" "$scratch/serve.out" 2>/dev/null && break; sleep 0.1; done
url=$(sed -n 's/.* on \(http:[^ ]*\).*/\1/p' "$scratch/serve.out")
name=$(sed -n "s/.*serving '\([^']*\)'.*/\1/p" "$scratch/serve.out")
[ -n "$url" ] || { tail -20 "$scratch/serve.log" >&2; exit 1; }
"$mc" bench serve --base-url "$url" --model "$name" --dataset "$data" --concurrency 32 --max-tokens 8 \
  --no-progress >"$scratch/warm.out"

offline_run() {
  # Two offline runs in a fresh process; the second (warm, like the long-running server) counts.
  "$mc" bench throughput --model "$scratch/model" --dataset "$data" --runs 2 --threads "$threads" \
    >"$scratch/off$1.out" 2>"$scratch/off$1.log" || { tail -20 "$scratch/off$1.log" >&2; exit 1; }
  offline+=("$(sed -n 's/^run 2: .* = \([0-9.]*\) tok\/s.*/\1/p' "$scratch/off$1.out")")
}
http_run() {
  "$mc" bench serve --base-url "$url" --model "$name" --dataset "$data" --concurrency 32 --no-progress \
    >"$scratch/http$1.out"
  http+=("$(sed -n 's/^output token throughput: \([0-9.]*\) tok\/s.*/\1/p' "$scratch/http$1.out")")
}
offline=(); http=()
for i in $(seq "$runs"); do
  # Alternate the order (offline first, then HTTP first, ...): load on a shared machine drifts.
  if (( i % 2 )); then offline_run "$i"; http_run "$i"; else http_run "$i"; offline_run "$i"; fi
  echo "pair $i: offline ${offline[-1]} tok/s, HTTP ${http[-1]} tok/s;" \
       "$(grep -E '^(ttft|itl)' "$scratch/http$i.out" | tr '\n' ';')" >&2
done
grep -E '^server' "$scratch/http$runs.out" >&2 || true
kill -TERM "$server"; wait "$server" || true; server=""

"$py" - "${offline[*]}" "${http[*]}" <<'PY'
import statistics, sys
off, http = ([float(x) for x in a.split()] for a in sys.argv[1:3])
print(f"offline W1 tok/s (median of {len(off)}): {statistics.median(off):.1f}")
print(f"HTTP streaming W1 tok/s, 32 clients (median of {len(http)}): {statistics.median(http):.1f}")
print(f"ratio HTTP/offline: {statistics.median(http) / statistics.median(off):.2f}x of the medians, "
      f"{statistics.median(h / o for h, o in zip(http, off)):.2f}x median per pair (target >= 0.90)")
PY
