"""`modelcall bench serve`: a client-side load generator for any OpenAI-compatible server.

Streams `/v1/completions` (prompt token ids or text, `ignore_eos`/`min_tokens` so every request
makes exactly its `max_tokens`) from N concurrent clients and reports what the clients saw: TTFT,
inter-token latency, request and output-token throughput. When the server is modelcall, its own
engine figures (`GET /-/stats`, and `GET /-/events` for each request's engine timings) are shown
beside them.

The three "first token" moments are kept apart: the engine's first token (server clock: received
-> first token sampled), the client's first event (any SSE data frame) and the client's first
content text; likewise the engine's inter-token latency vs the client's inter-event gaps.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec

from modelcall.plugins.bench import w2
from modelcall.plugins.bench.workload import load_rows


@dataclass
class RequestResult:
    ok: bool
    start: float
    first: float | None = None          # the first content text
    first_event: float | None = None    # the first SSE data frame of any kind
    end: float = 0.0
    chunk_times: list[float] = field(default_factory=list)  # every data frame with choices
    output_tokens: int = 0
    error: str = ""
    request_id: str | None = None       # the server's request id (modelcall: the response id minus its prefix)

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.start

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first."""
        if self.first is None or self.output_tokens < 2:
            return None
        return (self.end - self.first) / (self.output_tokens - 1)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", required=True, help="the model name the server serves")
    parser.add_argument("--dataset", default=None,
                        help='JSONL rows {"prompt_token_ids": [...] or "prompt": "...", "max_tokens": N}')
    parser.add_argument("--workload", choices=["w2"], default=None,
                        help="a built-in workload instead of --dataset: w2 = 64 requests sharing a 1,024-token "
                             "system prompt, each with its own 64-token user turn, 128 new tokens (needs --tokenizer)")
    parser.add_argument("--tokenizer", default=None, metavar="DIR",
                        help="the model directory whose tokenizer.json builds --workload's token ids")
    parser.add_argument("--write-dataset", default=None, metavar="FILE",
                        help="write the workload's rows (JSONL) to FILE, then benchmark as usual")
    parser.add_argument("--server-pid", type=int, default=None, metavar="PID",
                        help="also report the CPU seconds this process and its children spent during the timed run")
    parser.add_argument("--concurrency", type=int, default=32, help="clients sending at once")
    parser.add_argument("--num-requests", type=int, default=None, help="requests to send (default: one per row)")
    parser.add_argument("--max-tokens", type=int, default=None, help="override each row's max_tokens")
    parser.add_argument("--warmup", type=int, default=0, help="untimed requests first (at the same concurrency)")
    parser.add_argument("--api-key", default=None, help="sent as a Bearer token")
    parser.add_argument("--json", dest="json_out", default=None, metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--no-engine-events", action="store_true",
                        help="do not read modelcall's /-/events for the engine's own first-token and ITL figures")


def run(args: argparse.Namespace) -> int:
    if not args.dataset and not args.workload:
        raise SystemExit("bench serve: give --dataset FILE or --workload w2 --tokenizer DIR")
    figures = asyncio.run(bench(args))
    print(render(figures))
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=2)
    return 0 if figures["failed"] == 0 else 1


def workload_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """--dataset's rows, or the built-in --workload's (written to --write-dataset when asked)."""
    if getattr(args, "workload", None) == "w2":
        if not getattr(args, "tokenizer", None):
            raise SystemExit("--workload w2 needs --tokenizer DIR (the model directory)")
        rows = w2.make_rows(w2.tokenizer_encoder(args.tokenizer))
    else:
        rows = load_rows(args.dataset)
    if getattr(args, "write_dataset", None):
        with open(args.write_dataset, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return rows


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    rows = workload_rows(args)
    pid = getattr(args, "server_pid", None)
    n = args.num_requests or len(rows)
    base = args.base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(base_url=base, connector=connector, headers=headers, timeout=timeout) as session:
        if args.warmup:
            await _run_all(session, args, [rows[i % len(rows)] for i in range(args.warmup)], progress=False)
        before = await _server_stats(session)
        feed = None if getattr(args, "no_engine_events", False) or before is None else await EngineFeed.open(session)
        cpu0, client0 = (tree_cpu_seconds(pid) if pid else None), time.process_time()
        t0 = time.perf_counter()
        results = await _run_all(session, args, [rows[i % len(rows)] for i in range(n)],
                                 progress=not args.no_progress)
        wall = time.perf_counter() - t0
        cpu = {"client_cpu_s": time.process_time() - client0}
        if cpu0 is not None:
            cpu["server_cpu_s"] = tree_cpu_seconds(pid) - cpu0
        after = await _server_stats(session)
        if feed is not None:
            await feed.close([r.request_id for r in results if r.ok and r.request_id])
    figures = summarize(results, wall, args.concurrency, before, after, feed)
    figures.update(cpu)
    if "server_cpu_s" in cpu and figures["output_tokens"]:
        figures["server_cpu_ms_per_token"] = 1000 * cpu["server_cpu_s"] / figures["output_tokens"]
    return figures


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of `pid` and its live descendants (Linux /proc), threads included.

    vLLM serves from two processes (API server, engine core): both count."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        fields = raw[raw.rindex(b")") + 2:].split()  # after "pid (comm) ": state, ppid, ... utime stime
        stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    children: dict[int, list[int]] = {}
    for p, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(p)
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        if p in stats:
            total += stats[p][1]
            todo.extend(children.get(p, ()))
    return total


class EngineFeed:
    """modelcall's `/-/events` (token steps and ends) read while the benchmark runs: the engine's own
    first-token time and inter-token latency per request, measured on the server's clock."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session
        self.tokens: dict[str, list[float]] = {}
        self.ttft: dict[str, float] = {}
        self._ready = asyncio.Event()
        self._task: asyncio.Task | None = None

    @classmethod
    async def open(cls, session: aiohttp.ClientSession) -> EngineFeed | None:
        feed = cls(session)
        feed._task = asyncio.create_task(feed._read())
        try:
            await asyncio.wait_for(feed._ready.wait(), 5)
        except asyncio.TimeoutError:
            pass
        if not feed._ready.is_set() or feed._task.done():
            feed._task.cancel()
            return None
        return feed

    async def _read(self) -> None:
        try:
            async with self.session.get("/-/events?types=TokensEmitted,Finished") as resp:
                if resp.status != 200:
                    return
                async for line in resp.content:
                    if line.startswith(b"event: snapshot"):
                        self._ready.set()
                    elif line.startswith(b"data: {"):
                        self._apply(json.loads(line[6:]))
        except (aiohttp.ClientError, ValueError):
            return

    def _apply(self, ev: dict[str, Any]) -> None:
        rid = ev.get("request_id")
        if ev.get("type") == "TokensEmitted" and ev.get("token_ids"):
            self.tokens.setdefault(rid, []).append(ev["ts"])
        elif ev.get("type") == "Finished":
            t = ev["timings"]
            if t.get("first_token") is not None:
                self.ttft[rid] = t["first_token"] - t["received"]

    async def close(self, request_ids: list[str], timeout_s: float = 5.0) -> None:
        """Wait (briefly) until every request's end arrived, then stop reading."""
        deadline = time.perf_counter() + timeout_s
        while any(r not in self.ttft for r in request_ids) and time.perf_counter() < deadline:
            await asyncio.sleep(0.02)
        assert self._task is not None
        self._task.cancel()
        self.request_ids = request_ids

    def figures(self) -> dict[str, Any]:
        ids = getattr(self, "request_ids", list(self.ttft))
        gaps = [b - a for r in ids for a, b in zip(self.tokens.get(r, ()), self.tokens.get(r, ())[1:])]
        return {"engine_ttft_ms": _dist([self.ttft[r] for r in ids if r in self.ttft]), "engine_itl_ms": _dist(gaps),
                "engine_requests": sum(r in self.ttft for r in ids)}


async def _run_all(session: aiohttp.ClientSession, args: argparse.Namespace, rows: list[dict[str, Any]],
                   progress: bool) -> list[RequestResult]:
    queue: asyncio.Queue = asyncio.Queue()
    for row in rows:
        queue.put_nowait(row)
    results: list[RequestResult] = []
    bar = _progress(len(rows)) if progress else None

    async def client() -> None:
        while not queue.empty():
            row = queue.get_nowait()
            results.append(await one_request(session, args.model, row, args.max_tokens))
            if bar is not None:
                bar.update(1)

    await asyncio.gather(*(client() for _ in range(max(1, args.concurrency))))
    if bar is not None:
        bar.close()
    return results


def _progress(total: int) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc="requests", unit="req", file=sys.stderr, dynamic_ncols=True)


class _Choice(msgspec.Struct):
    text: Any = None


class _Usage(msgspec.Struct):
    completion_tokens: int = 0


class _Chunk(msgspec.Struct):
    """The fields of a streamed completions chunk the client reads (others are skipped unparsed)."""

    id: Any = None
    choices: list[_Choice] | None = None
    usage: _Usage | None = None


# NOTE: the client shares the machine with the server it measures: decoding only these fields, in C, costs it
# less CPU per chunk than json.loads building every dict (the same for every server measured).
_decode_chunk = msgspec.json.Decoder(_Chunk).decode


async def one_request(session: aiohttp.ClientSession, model: str, row: dict[str, Any],
                      max_tokens: int | None) -> RequestResult:
    n = max_tokens or row.get("max_tokens") or row.get("output_len") or 128
    body: dict[str, Any] = {"model": model, "max_tokens": n, "temperature": 0, "stream": True,
                            "stream_options": {"include_usage": True}, "ignore_eos": True, "min_tokens": n}
    body["prompt"] = row["prompt_token_ids"] if "prompt_token_ids" in row else row["prompt"]
    res = RequestResult(ok=False, start=time.perf_counter())
    chunks = 0
    try:
        async with session.post("/v1/completions", json=body) as resp:
            if resp.status != 200:
                res.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return res
            async for raw in resp.content:
                if not raw.startswith(b"data: ") or raw.startswith(b"data: [DONE]"):
                    continue
                now = time.perf_counter()
                if res.first_event is None:
                    res.first_event = now
                chunk = _decode_chunk(raw[6:])
                if res.request_id is None and isinstance(chunk.id, str):
                    res.request_id = chunk.id.removeprefix("cmpl-")
                if chunk.usage is not None and chunk.usage.completion_tokens:
                    res.output_tokens = chunk.usage.completion_tokens
                choices = chunk.choices or ()
                if choices:
                    res.chunk_times.append(now)
                if choices and choices[0].text:
                    chunks += 1
                    if res.first is None:
                        res.first = now
        res.end = time.perf_counter()
        res.output_tokens = res.output_tokens or chunks
        res.ok = True
    except (aiohttp.ClientError, asyncio.TimeoutError, msgspec.DecodeError) as e:
        res.error = f"{type(e).__name__}: {e}"
    return res


async def _server_stats(session: aiohttp.ClientSession) -> dict[str, Any] | None:
    """modelcall's own engine figures; None for other servers."""
    try:
        async with session.get("/-/stats") as resp:
            if resp.status == 200:
                return await resp.json()
    except (aiohttp.ClientError, ValueError):
        pass
    return None


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def _dist(values: list[float]) -> dict[str, float | None]:
    ms = [v * 1000 for v in values]
    return {"mean": statistics.fmean(ms) if ms else None, "p50": _pct(ms, 0.5), "p90": _pct(ms, 0.9),
            "p99": _pct(ms, 0.99)}


def summarize(results: list[RequestResult], wall: float, concurrency: int, before: dict | None,
              after: dict | None, feed: EngineFeed | None = None) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    itl = [b - a for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    tokens = sum(r.output_tokens for r in ok)
    out: dict[str, Any] = {
        "requests": len(results), "failed": len(results) - len(ok), "concurrency": concurrency,
        "wall_s": wall, "request_per_s": len(ok) / wall, "output_tokens": tokens, "output_tok_per_s": tokens / wall,
        "ttft_ms": _dist([r.ttft for r in ok if r.ttft is not None]),  # the client's first content text
        "first_event_ms": _dist([r.first_event - r.start for r in ok if r.first_event is not None]),
        "itl_ms": _dist(itl), "tpot_ms": _dist([r.tpot for r in ok if r.tpot is not None]),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
    }
    if feed is not None:
        out.update(feed.figures())
    if before is not None and after is not None:
        steps = after.get("steps", 0) - before.get("steps", 0)
        kv = after.get("kv", {})
        out["server"] = {"engine_steps": steps, "output_tokens_per_step": tokens / steps if steps else None,
                         "kv_blocks": kv.get("num_blocks"), "prefix_cache_hit_rate": kv.get("hit_rate"),
                         "running_after": after.get("running"), "waiting_after": after.get("waiting")}
    return out


def render(f: dict[str, Any]) -> str:
    def d(name: str) -> str:
        x = f[name]
        if x["p50"] is None:
            return f"{name}: n/a"
        return f"{name}: mean {x['mean']:.1f}  p50 {x['p50']:.1f}  p90 {x['p90']:.1f}  p99 {x['p99']:.1f}"

    def m(label: str, name: str, where: str) -> str:
        x = f.get(name)
        if not x or x["p50"] is None:
            return f"  {label:<28} n/a"
        return (f"  {label:<28} mean {x['mean']:7.1f}  p50 {x['p50']:7.1f}  p90 {x['p90']:7.1f}  p99 {x['p99']:7.1f}"
                f"   ({where})")

    lines = [f"requests: {f['requests']} ({f['failed']} failed) at concurrency {f['concurrency']} in {f['wall_s']:.2f} s",
             f"request throughput: {f['request_per_s']:.2f} req/s",
             f"output token throughput: {f['output_tok_per_s']:.1f} tok/s ({f['output_tokens']} tokens)",
             "first token, three moments apart (ms):",
             m("engine first token", "engine_ttft_ms", "server: received -> first token sampled"),
             m("client first event", "first_event_ms", "client: sent -> first SSE data frame"),
             m("client first content text", "ttft_ms", "client: sent -> first text"),
             "between tokens (ms):",
             m("engine inter-token latency", "engine_itl_ms", "server: gap between a request's token steps"),
             m("client inter-event gap", "itl_ms", "client: gap between SSE data frames"),
             d("tpot_ms")]
    if "server_cpu_s" in f:
        lines.append(f"server CPU: {f['server_cpu_s']:.2f} s over {f['wall_s']:.2f} s wall "
                     f"({f['server_cpu_ms_per_token']:.2f} ms per output token); client CPU {f['client_cpu_s']:.2f} s")
    if "server" in f:
        s = f["server"]
        per_step = s["output_tokens_per_step"]
        lines.append(f"server (modelcall): {s['engine_steps']} engine steps"
                     + (f", {per_step:.1f} output tokens per step" if per_step else "")
                     + (f", prefix-cache hit rate {s['prefix_cache_hit_rate']:.2f}" if s["prefix_cache_hit_rate"] is not None else ""))
    if f["errors"]:
        lines.append("errors: " + "; ".join(f["errors"]))
    return "\n".join(lines)
