#!/usr/bin/env python3
"""W4: 16 concurrent streams through each server, modelcall serve against llama-server -np 16 (issue 38).

    python benchmarks/w4_many_streams.py [--models smollm2,gemma3-270m] [--kinds shipped,F16,Q8_0,Q4_K_M]
        [--threads 1,2] [--runs 3] [--streams 16] [--prompt-tokens 128] [--new-tokens 256] [--out FILE]

Each round sends --streams streaming chat completions at once (openai SDK, one asyncio client), each a different
~128-token user message (gguf_peer.salt in front: no prefix shared beyond the chat template's, within a round or
with an earlier one, so neither server reuses a cached prompt), greedy, end of sequence ignored, --new-tokens each. Figures per round: aggregate
output tok/s = all completion tokens / (first request sent -> last stream closed), and every stream's TTFT; a
cell reports the median round's tok/s and TTFT p50/p99 over all rounds' streams. The servers are all up at once,
pinned to CPUs 0..N-1, and the rounds alternate between them (the order rotating each round; an idle server
waits on its socket): llama-server (`-np STREAMS`, `-c` = STREAMS x (prompt + new + 64), OMP_WAIT_POLICY unset) and
`modelcall serve --max-running STREAMS` with OMP_WAIT_POLICY=PASSIVE and unset.

Prints one JSON line per round ({"measure": "w4", ...}), one per cell ({"summary": "w4", ...}), then a markdown
table of the ratios modelcall / llama-server. Needs benchmarks/llama_cpp_peer.sh build.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gguf_peer as gp  # noqa: E402
from w0_single_stream import ENGINES, label, matrix_parser, parse_matrix  # noqa: E402


async def one_round(url: str, model: str, words: int, streams: int, new: int, run: int) -> dict:
    async with gp.client(url) as c:
        t = time.perf_counter()
        done = await asyncio.gather(*(gp.chat_stream(c, model, gp.prompt_text(words, gp.salt(run, i)), new)
                                      for i in range(streams)))
        wall = time.perf_counter() - t
    tokens = sum(s.completion_tokens for s in done)
    short = [s.completion_tokens for s in done if s.completion_tokens != new]
    if short:
        raise SystemExit(f"{len(short)} streams ended early ({short} tokens, not {new}): end of sequence not ignored?")
    return {"tok_s": tokens / wall, "wall_s": wall, "ttft_s": [s.ttft_s for s in done],
            "prompt_tokens": [s.prompt_tokens for s in done]}


def cell(model: str, kind: str, threads: int, args: argparse.Namespace) -> dict:
    file = gp.model_file(model, kind)
    shape = gp.file_shape(file)
    cpus = gp.cpus_for(threads)
    where = {"model": model, "kind": kind, "file": file.name, "weight_type": shape.weight_type, "threads": threads,
             "cpus": cpus, "streams": args.streams}
    print(f"# {model} {kind} ({file.name}), {threads} thread(s), {args.streams} streams", file=sys.stderr, flush=True)
    logs = Path(args.log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    context = args.prompt_tokens + args.new_tokens + 64
    servers = [gp.Server(e, file, threads, cpus, slots=args.streams, context=context, omp=omp,
                         log=logs / f"{model}-{kind}-{threads}-{e}-{omp or 'unset'}.log") for e, omp in ENGINES]
    got: dict[str, list[dict]] = {label(e, omp): [] for e, omp in ENGINES}
    with contextlib.ExitStack() as up:
        for server in servers:
            up.enter_context(server)
        # sized on llama-server's template; the same texts then go to every server
        words = asyncio.run(_sized(servers[0].url, servers[0].model, args.prompt_tokens))
        named = [(label(e, omp), server) for (e, omp), server in zip(ENGINES, servers)]
        for name, server in named:
            asyncio.run(one_round(server.url, server.model, words, 2, 8, args.runs))   # a run no round shares
        for i in range(args.runs):
            for name, server in named[i % len(named):] + named[:i % len(named)]:
                # the same texts to every server (separate processes: no cache crosses between them)
                r = asyncio.run(one_round(server.url, server.model, words, args.streams, args.new_tokens, i))
                got[name].append(r)
                print(json.dumps({"measure": "w4", **where, "engine": name, "run": i + 1,
                                  "tok_s": round(r["tok_s"], 2), "wall_s": round(r["wall_s"], 3),
                                  "ttft_p50_ms": round(1e3 * gp.percentile(r["ttft_s"], 50), 1),
                                  "ttft_p99_ms": round(1e3 * gp.percentile(r["ttft_s"], 99), 1),
                                  "prompt_tokens": gp.median(r["prompt_tokens"])}), flush=True)
    engines = {}
    for name, rs in got.items():
        ttfts = [t for r in rs for t in r["ttft_s"]]
        engines[name] = {"tok_s": round(gp.median([r["tok_s"] for r in rs]), 2),
                         "runs_tok_s": [round(r["tok_s"], 2) for r in rs],
                         "ttft_p50_ms": round(1e3 * gp.percentile(ttfts, 50), 1),
                         "ttft_p99_ms": round(1e3 * gp.percentile(ttfts, 99), 1)}
    summary = {"summary": "w4", **where, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
               "engines": engines}
    print(json.dumps(summary), flush=True)
    return summary


async def _sized(url: str, model: str, tokens: int) -> int:
    async with gp.client(url) as c:
        return await gp.words_for(c, model, tokens, salt="#9000-100:")   # the rounds' salts' length


def table(summaries: list[dict]) -> str:
    out = ["| model | weights (file) | threads | streams | llama-server tok/s | modelcall PASSIVE / unset tok/s | "
           "ratio PASSIVE / unset | TTFT p50 / p99 ms llama-server | modelcall PASSIVE | modelcall unset |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        e = s["engines"]
        peer, mp, mu = e["llama.cpp"], e["modelcall (PASSIVE)"], e["modelcall (OMP unset)"]
        out.append(f"| {s['model']} | {s['kind']} ({s['weight_type']}) | {s['threads']} | {s['streams']} | "
                   f"{peer['tok_s']:.1f} | {mp['tok_s']:.1f} / {mu['tok_s']:.1f} | {mp['tok_s'] / peer['tok_s']:.2f}× / "
                   f"{mu['tok_s'] / peer['tok_s']:.2f}× | {peer['ttft_p50_ms']:.0f} / {peer['ttft_p99_ms']:.0f} | "
                   f"{mp['ttft_p50_ms']:.0f} / {mp['ttft_p99_ms']:.0f} | {mu['ttft_p50_ms']:.0f} / {mu['ttft_p99_ms']:.0f} |")
    return "\n".join(out)


def parse(argv: list[str]) -> argparse.Namespace:
    ap = matrix_parser(__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--log-dir", default="/tmp/w4-logs", help="the servers' logs")
    return parse_matrix(ap, argv, streams=True)


def main(argv: list[str]) -> int:
    args = parse(argv)
    gp.peer("server")   # fail before loading anything when the peer is not built
    summaries = [cell(m, k, t, args) for m in args.models for k in args.kinds for t in args.threads]
    gp.report(f"W4: {args.streams} concurrent streams, {args.prompt_tokens}-token prompts, {args.new_tokens} new, "
              f"greedy, median round of {args.runs}; ratios modelcall / llama-server measured in this run",
              table(summaries), summaries, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
