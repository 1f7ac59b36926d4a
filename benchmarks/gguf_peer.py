"""What W0, W0-chat and W4 share: the llama.cpp peer's paths, the GGUF files of each type, the read-rate floor,
and the two OpenAI-compatible servers started pinned to the same CPUs.

    python benchmarks/gguf_peer.py probe THREADS     # this machine's memory read rate, GB/s (best of 3)

The peer is built once by benchmarks/llama_cpp_peer.sh (llama-cpp-python 0.3.36 and llama-server from the
llama.cpp sources it vendors); a missing build is a SystemExit naming the build command, never a skipped engine.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PEER_SH = REPO / "benchmarks" / "llama_cpp_peer.sh"
MODELCALL = REPO / ".venv" / "bin" / "modelcall"
MODELS = ("smollm2", "gemma3-270m")
KINDS = ("shipped", "F16", "Q8_0", "Q4_K_M")   # shipped: the file as fetch-model gives it (Q4_1, Q4_K_M)


def peer(what: str) -> str:
    """The peer venv's python (`python`) or the llama-server binary (`server`); exits when not built."""
    out = subprocess.run(["bash", str(PEER_SH), what], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(out.stderr.strip() or f"{PEER_SH} {what} failed with status {out.returncode}")
    return out.stdout.strip()


def model_file(name: str, kind: str) -> Path:
    """The GGUF file of model `name` at `kind`: the shipped file, or llama.cpp's requantized copy beside it."""
    if kind not in KINDS:
        raise SystemExit(f"unknown weight type {kind!r}: choose from {', '.join(KINDS)}")
    out = subprocess.run([str(MODELCALL), "fetch-model", name], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"modelcall fetch-model {name} failed: {out.stderr.strip()}")
    shipped = Path(out.stdout.strip().splitlines()[-1])
    if kind == "shipped":
        return shipped
    done = subprocess.run([peer("python"), str(REPO / "benchmarks" / "llama_cpp_quantize.py"), str(shipped), kind],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"requantizing {shipped} to {kind} failed: {done.stderr.strip()[-2000:]}")
    return Path(done.stdout.split()[-1])


# ---- the floor: bytes read per output token over the measured read rate ------------------------------------------

@dataclass(frozen=True)
class FileShape:
    weight_type: str          # the type most of the weight bytes are in (e.g. Q4_K), for the tables
    weight_bytes: int         # read once per output token at batch 1
    kv_bytes_per_position: int  # K and V of one position over all layers, at f16 (llama.cpp's default cache)


def file_shape(path: Path) -> FileShape:
    """Bytes one decode step must read: every tensor once, except the embedding's rows when a separate output
    matrix exists (a tied embedding is read whole, as the output projection)."""
    import gguf
    r = gguf.GGUFReader(str(path))
    f = r.fields
    arch = f["general.architecture"].contents()
    untied = {"output.weight", "token_embd.weight"} <= {t.name for t in r.tensors}
    read: dict[str, int] = {}   # bytes read per token by tensor type
    for t in r.tensors:
        n = int(t.n_bytes)
        if untied and t.name == "token_embd.weight":
            n //= int(t.shape[-1])   # only the token's own row of an embedding that is not the output matrix
        read[t.tensor_type.name] = read.get(t.tensor_type.name, 0) + n
    heads = f[f"{arch}.attention.head_count"].contents()
    kv_heads = f[f"{arch}.attention.head_count_kv"].contents() if f"{arch}.attention.head_count_kv" in f else heads
    head_dim = (f[f"{arch}.attention.key_length"].contents() if f"{arch}.attention.key_length" in f
                else f[f"{arch}.embedding_length"].contents() // heads)
    layers = f[f"{arch}.block_count"].contents()
    return FileShape(max(read, key=read.__getitem__), sum(read.values()), layers * 2 * kv_heads * head_dim * 2)


def floor_ms(shape: FileShape, mean_context: float, read_gb_s: float) -> float:
    return 1e3 * (shape.weight_bytes + shape.kv_bytes_per_position * mean_context) / (read_gb_s * 1e9)


def read_rate(threads: int, cpus: str) -> float:
    """GB/s a max over 1 GiB reaches on `cpus` with `threads` threads (best of 3), in a pinned subprocess.

    NOTE: numpy's max, not sum: float32 sum is pairwise and reached 6.8 GB/s where max reached 10.6 on one
    Zen 4 thread (2026-12-04, loaded machine); the floor must not be set by the probe's own arithmetic."""
    out = subprocess.run(["taskset", "-c", cpus, sys.executable, __file__, "probe", str(threads)],
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def _probe(threads: int) -> float:
    import numpy as np
    a = np.ones(1 << 28, dtype=np.float32)   # 1 GiB, pages touched
    parts = np.array_split(a, threads)
    best = float("inf")
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:  # numpy's reductions release the GIL
        for _ in range(3):
            t = time.perf_counter()
            list(pool.map(np.max, parts))
            best = min(best, time.perf_counter() - t)
    return a.nbytes / best / 1e9


# ---- the two servers -----------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpus_for(threads: int, first_cpu: int = 0) -> str:
    n = os.cpu_count() or 1
    if first_cpu + threads > n:
        raise SystemExit(f"{threads} threads from CPU {first_cpu} need {first_cpu + threads} CPUs; this machine has {n}")
    return ",".join(str(c) for c in range(first_cpu, first_cpu + threads))


def runner_config() -> str:
    """MODELCALL_BENCH_RUNNER: a JSON object of runner plugin settings modelcall runs the workloads with (e.g.
    '{"int8_activations": true}': llama.cpp's int8 activations), empty for the defaults."""
    return os.environ.get("MODELCALL_BENCH_RUNNER", "")


def serve_options() -> list[str]:
    """MODELCALL_BENCH_SERVE: more `modelcall serve` options the servers run with (e.g. '--burst-budget-ms 100'),
    empty for the defaults."""
    return shlex.split(os.environ.get("MODELCALL_BENCH_SERVE", ""))


def peer_env(engine: str, omp: str | None) -> dict[str, str]:
    """The engine's environment: llama.cpp at its defaults (OMP_WAIT_POLICY unset), modelcall as asked."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    if omp:
        env["OMP_WAIT_POLICY"] = omp
    return env


class Server:
    """One OpenAI-compatible server process, pinned, on a loopback port; `with` starts it and waits until ready."""

    def __init__(self, engine: str, file: Path, threads: int, cpus: str, *, slots: int = 1, context: int = 512,
                 omp: str | None = None, log: Path | None = None) -> None:
        self.engine, self.port = engine, free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        if engine == "llama.cpp":
            # NOTE: llama-server splits -c over its -np slots: each slot gets context // slots positions.
            argv = [peer("server"), "-m", str(file), "-t", str(threads), "-tb", str(threads), "-c",
                    str(context * slots), "-np", str(slots), "--host", "127.0.0.1", "--port", str(self.port)]
        else:
            argv = [str(MODELCALL), "serve", "--model", str(file), "--threads", str(threads), "--port",
                    str(self.port), "--max-running", str(max(slots, 1))]
            if runner_config():
                argv += ["--plugin-config", f"runner={runner_config()}"]
            argv += serve_options()
        self.argv = ["taskset", "-c", cpus, *argv]
        self.env = peer_env(engine, omp)
        self.log = log
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Server:
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.engine} server exited with status {self.proc.returncode}: "
                                 f"{' '.join(self.argv)} (log: {self.log})")
            try:
                with urllib.request.urlopen(self.url + "/models", timeout=2) as r:
                    self.model = json.load(r)["data"][0]["id"]
                    return self
            except (OSError, ValueError, KeyError, IndexError):
                time.sleep(0.5)
        self.__exit__()
        raise SystemExit(f"{self.engine} server not ready after 600 s: {' '.join(self.argv)}")

    def __exit__(self, *exc: object) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Stream:
    ttft_s: float          # request sent -> first content chunk
    total_s: float         # request sent -> stream closed
    completion_tokens: int
    prompt_tokens: int | None
    text: str

    @property
    def decode_tok_s(self) -> float:
        return (self.completion_tokens - 1) / max(self.total_s - self.ttft_s, 1e-9)


def client(url: str):
    """An openai.AsyncOpenAI client for one of the servers: no retries (a failure shows), long timeout."""
    from openai import AsyncOpenAI
    return AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=900)


async def chat_stream(client, model: str, text: str, new_tokens: int) -> Stream:
    """One streaming chat completion (an openai.AsyncOpenAI client), greedy, end of sequence ignored: both
    servers take `ignore_eos` (llama-server bans every end-of-generation token with it)."""
    t = time.perf_counter()
    first, pieces, usage = None, [], None
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], max_tokens=new_tokens, temperature=0,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                first = first or time.perf_counter()
                pieces.append(c.delta.content)
    end = time.perf_counter()
    if first is None:
        raise RuntimeError(f"{model}: the stream carried no content")
    tokens = usage.completion_tokens if usage else len(pieces)
    return Stream(first - t, end - t, tokens, usage.prompt_tokens if usage else None, "".join(pieces))


async def prompt_tokens_of(client, model: str, text: str) -> int:
    done = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}],
                                                max_tokens=1, temperature=0)
    return done.usage.prompt_tokens


async def words_for(client, model: str, tokens: int, salt: str = "#9000") -> int:
    """How many words of prompt_text(words, salt) make a chat prompt of about `tokens` tokens on this server's
    template. Give a salt no measured run uses: the server keeps the sizing prompts in its prompt cache."""
    async def count(words: int) -> int:
        return await prompt_tokens_of(client, model, prompt_text(words, salt))
    a, b = 40, 120
    pa, pb = await count(a), await count(b)
    words = max(1, round(a + (tokens - pa) * (b - a) / max(pb - pa, 1)))
    for _ in range(8):   # the slope is nearly exact; a step or two settles it
        p = await count(words)
        if p == tokens or (p > tokens and await count(words - 1) < tokens):
            break
        words += 1 if p < tokens else -1
    return words


def salt(run: int, stream: int | None = None) -> str:
    """A prompt's distinct start, the same length for every run (both servers cache prompts: llama-server a
    slot's last prompt, modelcall every prefix), so each measured request computes its whole prompt."""
    return f"#{1000 + run}" if stream is None else f"#{1000 + run}-{100 + stream}:"


PARAGRAPH = ("The river town woke slowly that autumn morning. Fishermen checked their nets along the quay while "
             "the baker opened his shutters and the smell of warm bread drifted over the cobbled square. Children "
             "ran to the old stone school, past the market stalls where farmers stacked apples, pears and late "
             "plums. At the far end of the harbour a small ferry sounded its horn, and the gulls rose in a white "
             "cloud above the water. ")


def prompt_text(words: int, salt: str = "") -> str:
    """A plain-prose user message of about `words` words; `salt` in front makes prompts share no prefix."""
    base = (PARAGRAPH * (words // len(PARAGRAPH.split()) + 1)).split()[:words]
    return (salt + " " if salt else "") + " ".join(base) + "\nContinue the story."


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (p99 of 16 values is the largest)."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(-(-q * len(s) // 100)) - 1))]


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "probe":
        print(f"{_probe(int(sys.argv[2])):.2f}")
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


def report(title: str, table: str, summaries: list[dict], out: str | None) -> None:
    """A workload's ending: its title and markdown table on stdout, its summary JSON lines appended to `out`."""
    print(f"\n== {title}")
    print(table)
    if out:
        with open(out, "a", encoding="utf-8") as f:
            for s in summaries:
                f.write(json.dumps(s) + "\n")
