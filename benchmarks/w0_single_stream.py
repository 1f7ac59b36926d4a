#!/usr/bin/env python3
"""W0: one stream, modelcall against llama.cpp on the same GGUF file (issue 38), both in one run.

    python benchmarks/w0_single_stream.py [--models smollm2,gemma3-270m] [--kinds shipped,F16,Q8_0,Q4_K_M]
        [--threads 1,2] [--runs 3] [--prompt-tokens 128] [--new-tokens 256] [--chat] [--out FILE]

In process (default): each engine loads the file in its own subprocess (benchmarks/w0_workers.py), pinned with
taskset to CPUs 0..N-1, and the runs alternate engine by engine (the order rotates each run); figures are medians
of --runs after one short warm-up each. The same 128 prompt token ids (llama.cpp's tokenization of plain prose,
no BOS) go to both; greedy; end of sequence banned; --new-tokens tokens. llama.cpp runs with OMP_WAIT_POLICY
unset (its own default: with PASSIVE its 2-thread decode collapsed, NOTES.md), modelcall both PASSIVE and unset.

--chat (W0-chat): the same through each engine's OpenAI-compatible server, `llama-server -m FILE -t N` and
`modelcall serve --model FILE --threads N`, one streaming chat completion at a time with the openai SDK (the
client unpinned), the user message sized so llama-server counts --prompt-tokens prompt tokens and made distinct
run by run (both servers cache prompts; run i's text is the same for every server).

TTFT: request sent -> first token. Decode tok/s: (tokens - 1) / (last token - first token). The floor: bytes one
decode step reads (every weight once, K/V at f16 of the mean context) over this machine's read rate, measured
pinned to the same CPUs (benchmarks/gguf_peer.py probe), printed beside each engine's ms per token.

Prints one JSON line per measured run ({"measure": "w0", ...}), one per cell ({"summary": "w0", ...}), then a
markdown table of the ratios modelcall / llama.cpp measured in this run. Needs the peer:
benchmarks/llama_cpp_peer.sh build (once, about 25 minutes on 2 cores).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gguf_peer as gp  # noqa: E402

WORKERS = Path(__file__).resolve().parent / "w0_workers.py"
# (engine, OMP_WAIT_POLICY): llama.cpp at its default only; modelcall both ways (NOTES.md)
ENGINES = (("llama.cpp", None), ("modelcall", "PASSIVE"), ("modelcall", None))


def label(engine: str, omp: str | None) -> str:
    return engine if engine == "llama.cpp" else f"modelcall ({omp or 'OMP unset'})"


class Worker:
    """One in-process engine in a pinned subprocess, answering w0_workers.py's JSON commands."""

    def __init__(self, engine: str, omp: str | None, file: Path, threads: int, cpus: str, context: int) -> None:
        python = gp.peer("python") if engine == "llama.cpp" else str(gp.REPO / ".venv" / "bin" / "python")
        self.name = label(engine, omp)
        self.proc = subprocess.Popen(["taskset", "-c", cpus, python, str(WORKERS), engine, str(file), str(threads),
                                      str(context)], env=gp.peer_env(engine, omp), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        self.answer()   # ready

    def answer(self) -> dict:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("@@ "):
                return json.loads(line[3:])
        raise SystemExit(f"{self.name} worker exited with status {self.proc.wait()} (its stderr is above)")

    def ask(self, **cmd: object) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        return self.answer()

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(60)


class ChatPeer:
    """One engine's server, asked one streaming chat completion at a time (W0-chat)."""

    def __init__(self, engine: str, omp: str | None, file: Path, threads: int, cpus: str, context: int,
                 log: Path) -> None:
        self.name = label(engine, omp)
        self.server = gp.Server(engine, file, threads, cpus, context=context, omp=omp, log=log).__enter__()
        self.words = 0

    def call(self, fn, *args: object):
        """fn(client, model, *args) on a fresh client (an async client belongs to the event loop that made it)."""
        async def go():
            async with gp.client(self.server.url) as c:
                return await fn(c, self.server.model, *args)
        return asyncio.run(go())

    def run(self, run: int, new: int) -> dict:
        s = self.call(gp.chat_stream, gp.prompt_text(self.words, gp.salt(run)), new)
        return {"ttft_s": s.ttft_s, "total_s": s.total_s, "tokens": s.completion_tokens,
                "prompt_tokens": s.prompt_tokens, "text": s.text}

    def close(self) -> None:
        self.server.__exit__()


def measure(peers: list, run, runs: int, new: int) -> dict[str, list[dict]]:
    """Warm each peer once, then `runs` rounds alternating the peers, the order rotating each round."""
    for p in peers:
        run(p, runs, min(new, 16))   # run index `runs`: a warm-up prompt no measured run shares
    got: dict[str, list[dict]] = {p.name: [] for p in peers}
    for i in range(runs):
        for p in peers[i % len(peers):] + peers[:i % len(peers)]:
            r = run(p, i, new)
            if r["tokens"] != new:
                raise SystemExit(f"{p.name} made {r['tokens']} tokens, not {new}: end of sequence not banned?")
            r["decode_tok_s"] = (r["tokens"] - 1) / (r["total_s"] - r["ttft_s"])
            got[p.name].append(r)
    return got


def agreement(a: str, b: str) -> int:
    """Characters the two greedy outputs share from the start (same file, same ids: they should agree long)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def cell(model: str, kind: str, threads: int, args: argparse.Namespace, rate: float) -> dict:
    file = gp.model_file(model, kind)
    shape = gp.file_shape(file)
    cpus = gp.cpus_for(threads)
    context = args.prompt_tokens + args.new_tokens + 64
    floor = gp.floor_ms(shape, args.prompt_tokens + args.new_tokens / 2, rate)
    where = {"model": model, "kind": kind, "file": file.name, "weight_type": shape.weight_type,
             "weight_mb": round(shape.weight_bytes / 1e6, 1), "threads": threads, "cpus": cpus}
    print(f"# {model} {kind} ({file.name}, mostly {shape.weight_type}), {threads} thread(s) on CPUs {cpus}",
          file=sys.stderr, flush=True)
    peers: list = []
    try:
        if args.chat:
            logs = Path(args.log_dir)
            logs.mkdir(parents=True, exist_ok=True)
            for engine, omp in ENGINES:
                log = logs / f"{model}-{kind}-{threads}-{engine}-{omp or 'unset'}.log"
                peers.append(ChatPeer(engine, omp, file, threads, cpus, context, log))
            words = peers[0].call(gp.words_for, args.prompt_tokens)   # sized on llama-server's template
            for p in peers:
                p.words = words
            got = measure(peers, lambda p, i, n: p.run(i, n), args.runs, args.new_tokens)
        else:
            for engine, omp in ENGINES:
                peers.append(Worker(engine, omp, file, threads, cpus, context))
            ids = peers[0].ask(op="tokenize", text=gp.prompt_text(4 * args.prompt_tokens))["ids"]
            if len(ids) < args.prompt_tokens:
                raise SystemExit(f"the prompt text made {len(ids)} tokens, fewer than {args.prompt_tokens}")
            ids = ids[:args.prompt_tokens]
            got = measure(peers, lambda p, i, n: p.ask(op="run", prompt_ids=ids, new=n), args.runs, args.new_tokens)
    finally:
        for p in peers:
            p.close()
    workload = "w0-chat" if args.chat else "w0"
    for name, rs in got.items():
        for i, r in enumerate(rs):
            print(json.dumps({"measure": workload, **where, "engine": name, "run": i + 1,
                              "ttft_ms": round(1e3 * r["ttft_s"], 2), "decode_tok_s": round(r["decode_tok_s"], 2),
                              "ms_per_token": round(1e3 / r["decode_tok_s"], 3), "tokens": r["tokens"],
                              **({"prompt_tokens": r["prompt_tokens"]} if "prompt_tokens" in r else {})}), flush=True)
    engines = {name: {"decode_tok_s": round(gp.median([r["decode_tok_s"] for r in rs]), 2),
                      "ttft_ms": round(1e3 * gp.median([r["ttft_s"] for r in rs]), 2),
                      "runs_tok_s": [round(r["decode_tok_s"], 2) for r in rs]} for name, rs in got.items()}
    for e in engines.values():
        e["ms_per_token"] = round(1e3 / e["decode_tok_s"], 3)
    peer_text = got["llama.cpp"][0]["text"]
    summary = {"summary": workload, **where, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
               "read_gb_s": round(rate, 2), "floor_ms_per_token": round(floor, 3), "engines": engines,
               "agree_chars": {n: agreement(peer_text, rs[0]["text"]) for n, rs in got.items() if n != "llama.cpp"}}
    print(json.dumps(summary), flush=True)
    return summary


def table(summaries: list[dict]) -> str:
    out = ["| model | weights (file) | threads | llama.cpp tok/s | modelcall PASSIVE / unset tok/s | ratio "
           "PASSIVE / unset | TTFT ms llama.cpp / modelcall | ms per token llama.cpp / modelcall / floor |",
           "|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        e = s["engines"]
        peer, mp, mu = e["llama.cpp"], e["modelcall (PASSIVE)"], e["modelcall (OMP unset)"]
        best = min(mp["ttft_ms"], mu["ttft_ms"])
        out.append(f"| {s['model']} | {s['kind']} ({s['weight_type']}) | {s['threads']} | {peer['decode_tok_s']:.1f} | "
                   f"{mp['decode_tok_s']:.1f} / {mu['decode_tok_s']:.1f} | "
                   f"{mp['decode_tok_s'] / peer['decode_tok_s']:.2f}× / {mu['decode_tok_s'] / peer['decode_tok_s']:.2f}× | "
                   f"{peer['ttft_ms']:.0f} / {best:.0f} | {peer['ms_per_token']:.2f} / "
                   f"{min(mp['ms_per_token'], mu['ms_per_token']):.2f} / {s['floor_ms_per_token']:.2f} |")
    return "\n".join(out)


def csv(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def matrix_parser(description: str) -> argparse.ArgumentParser:
    """The flags W0 and W4 share: which models, kinds and thread counts, runs, prompt and output sizes, --out."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--models", type=csv, default=list(gp.MODELS))
    ap.add_argument("--kinds", type=csv, default=list(gp.KINDS), help="shipped, F16, Q8_0, Q4_K_M")
    ap.add_argument("--threads", type=lambda t: [int(x) for x in csv(t)], default=[1, 2])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--out", help="also append the summary JSON lines to this file")
    return ap


def parse_matrix(ap: argparse.ArgumentParser, argv: list[str], streams: bool = False) -> argparse.Namespace:
    """`argv` by `ap` (matrix_parser's flags and the workload's own), refused with one line naming what is wrong."""
    args = ap.parse_args(argv)
    bad = [m for m in args.models if m not in gp.MODELS] + [k for k in args.kinds if k not in gp.KINDS]
    if (bad or args.runs < 1 or args.new_tokens < 2 or args.prompt_tokens < 1 or min(args.threads) < 1
            or (streams and args.streams < 1)):
        ap.error(f"models from {gp.MODELS}, kinds from {gp.KINDS}, runs, prompt tokens, threads"
                 f"{', streams' if streams else ''} >= 1, new tokens >= 2" + (f"; unknown: {bad}" if bad else ""))
    return args


def parse(argv: list[str]) -> argparse.Namespace:
    ap = matrix_parser(__doc__.split("\n")[0])
    ap.add_argument("--chat", action="store_true", help="W0-chat: through each engine's HTTP server")
    ap.add_argument("--log-dir", default="/tmp/w0-chat-logs", help="the servers' logs (W0-chat)")
    return parse_matrix(ap, argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    gp.peer("python")   # fail now, not after loading models, when the peer is not built
    if args.chat:
        gp.peer("server")
    rates = {t: gp.read_rate(t, gp.cpus_for(t)) for t in args.threads}
    print(f"# read rate GB/s by threads: {rates}", file=sys.stderr, flush=True)
    summaries = [cell(m, k, t, args, rates[t]) for m in args.models for k in args.kinds for t in args.threads]
    gp.report(f"W0{'-chat' if args.chat else ''}: {args.prompt_tokens}-token prompt, {args.new_tokens} new, greedy, "
              f"median of {args.runs}; ratios modelcall / llama.cpp measured in this run", table(summaries), summaries,
              args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
