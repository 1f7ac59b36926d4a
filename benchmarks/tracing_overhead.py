"""Throughput with OpenTelemetry tracing on (OTLP/HTTP export) against off, in one run.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/tracing_overhead.py [--rounds 5] [--model DIR]

32 requests of 128 prompt token ids, 128 new tokens each, greedy, end-of-sequence ignored, all
submitted at once; output tokens per wall second. Two warm kernels, identical but for
`plugin_config["otel"]`, run in alternation (off, on, on, off, ...) so machine noise hits both;
the figure is the ratio of the medians (throughput, and process CPU time per output token).
The spans go to a real OTLP/HTTP receiver in a separate process (so its decoding is not
charged to the server), which counts them: one request span plus queue/prefill/decode each.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time

import anyio

from modelcall.core import Kernel, SamplingParams

# the random-weight demo model when no --model is given, as these figures were measured (issue 19)
os.environ.setdefault("MODELCALL_DEMO_MODEL", "random")


def receiver(port_file: str) -> None:
    """A separate process: POST /v1/traces (protobuf) counts spans, GET /count says how many."""
    from aiohttp import web
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    spans = [0]

    async def traces(request: web.Request) -> web.Response:
        msg = trace_service_pb2.ExportTraceServiceRequest()
        msg.ParseFromString(await request.read())
        spans[0] += sum(len(ss.spans) for rs in msg.resource_spans for ss in rs.scope_spans)
        return web.Response(body=trace_service_pb2.ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    async def count(_request: web.Request) -> web.Response:
        return web.Response(text=str(spans[0]))

    async def start() -> None:
        app = web.Application()
        app.router.add_post("/v1/traces", traces)
        app.router.add_get("/count", count)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        with open(port_file + ".tmp", "w") as f:
            f.write(str(runner.addresses[0][1]))
        os.replace(port_file + ".tmp", port_file)
        while True:
            await anyio.sleep(3600)

    anyio.run(start)


async def run_once(kernel: Kernel, prompts: list[list[int]], max_tokens: int) -> tuple[float, float]:
    """(output tokens per wall second, process CPU microseconds per output token)."""
    kernel.kv.reset_prefix_cache()
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    made: list[int] = []

    async def one(ids: list[int]) -> None:
        made.append((await kernel.complete(prompt_token_ids=ids, params=params)).usage.completion_tokens)

    t0, c0 = time.perf_counter(), time.process_time()
    async with anyio.create_task_group() as tg:
        for ids in prompts:
            tg.start_soon(one, ids)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return sum(made) / wall, 1e6 * cpu / sum(made)


async def main(args: argparse.Namespace) -> None:
    import tempfile
    import urllib.request

    port_file = os.path.join(tempfile.mkdtemp(prefix="modelcall-otlp-"), "port")
    proc = subprocess.Popen([sys.executable, __file__, "--receiver", port_file])
    try:
        while not os.path.exists(port_file):
            await anyio.sleep(0.05)
        base = f"http://127.0.0.1:{open(port_file).read()}"
        common = {"model": args.model, "dtype": args.dtype, "threads": args.threads, "max_num_seqs": args.requests,
                  "num_kv_blocks": args.requests * ((args.prompt + args.max_tokens) // 16 + 2)}
        common = {k: v for k, v in common.items() if v is not None}
        off = Kernel(**common)
        on = Kernel(plugin_config={"otel": {"endpoint": base + "/v1/traces"}}, **common)
        async with off, on:
            rng = random.Random(0)
            vocab = off.spec.vocab_size
            prompts = [[rng.randrange(3, vocab) for _ in range(args.prompt)] for _ in range(args.requests)]
            print(f"{off.model_name}: {args.requests} requests x {args.prompt} prompt + {args.max_tokens} new tokens, "
                  f"{args.rounds} rounds each; spans to {base}", flush=True)
            for k in (off, on):
                await run_once(k, prompts[:4], 8)  # warm-up
            from modelcall.plugins.otel.plugin import tracing_of

            tracing = tracing_of(on)
            tracing_cpu = thread_cpu(tracing)
            rates: dict[str, list[float]] = {"off": [], "on": []}
            cpus: dict[str, list[float]] = {"off": [], "on": []}
            for r in range(args.rounds):
                for name in (("off", "on") if r % 2 == 0 else ("on", "off")):
                    rate, cpu = await run_once(off if name == "off" else on, prompts, args.max_tokens)
                    rates[name].append(rate)
                    cpus[name].append(cpu)
                    print(f"round {r + 1} {name:>3}: {rate:8.1f} tok/s, {cpu:7.1f} CPU µs per token", flush=True)
            await anyio.to_thread.run_sync(tracing.flush)
            built, dropped = tracing.builder.spans, tracing.observer.dropped
        received = int(urllib.request.urlopen(base + "/count", timeout=10).read())
    finally:
        proc.terminate()
        proc.wait(10)
    med = {k: statistics.median(v) for k, v in rates.items()}
    cpu = {k: statistics.median(v) for k, v in cpus.items()}
    print(f"median tok/s: off {med['off']:.1f}, on {med['on']:.1f}; on/off = {med['on'] / med['off']:.3f} "
          f"({100 * (med['on'] / med['off'] - 1):+.1f}%)")
    print(f"median CPU µs per output token: off {cpu['off']:.1f}, on {cpu['on']:.1f}; "
          f"on/off = {cpu['on'] / cpu['off']:.3f} ({100 * (cpu['on'] / cpu['off'] - 1):+.1f}%)")
    print(f"spans built {built}, received by the collector {received}, events dropped {dropped}")
    # NOTE: the ratio above is at the mercy of other load on a shared machine; the CPU the tracing
    # threads themselves used is not, and bounds what tracing can take from the engine.
    total_cpu = sum(c * args.requests * args.max_tokens for c in cpus["on"]) / 1e6
    used = tracing_cpu["build"] + tracing_cpu["export"]
    gc_s = tracing_cpu["gc"]
    print(f"tracing threads' CPU over the {args.rounds} 'on' rounds: span building {1e3 * tracing_cpu['build']:.1f} ms, "
          f"export {1e3 * tracing_cpu['export']:.1f} ms = {100 * used / total_cpu:.2f}% of the process CPU of those rounds; "
          f"of it, garbage collections that began on those threads {1e3 * gc_s:.1f} ms; without them "
          f"{100 * (used - gc_s) / total_cpu:.2f}%")


def thread_cpu(tracing: object) -> dict[str, float]:
    """Wrap the span builder and the exporter so the CPU time of their threads adds up here (and,
    apart, the garbage collections that started on those threads: a collection walks the whole
    process's objects, so it is charged to whichever thread happened to allocate last)."""
    import gc
    import threading

    spent = {"build": 0.0, "export": 0.0, "gc": 0.0}
    started: dict[int, float] = {}
    mine: set[int] = set()

    def on_gc(phase: str, _info: dict) -> None:
        ident = threading.get_ident()
        if ident not in mine:
            return
        if phase == "start":
            started[ident] = time.thread_time()
        elif ident in started:
            spent["gc"] += time.thread_time() - started.pop(ident)

    gc.callbacks.append(on_gc)

    def timed(fn, key):  # noqa: ANN001, ANN202
        def run(*a, **kw):  # noqa: ANN002, ANN003, ANN202
            mine.add(threading.get_ident())
            c0 = time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                spent[key] += time.thread_time() - c0
        return run

    tracing.observer._handle_batch = timed(tracing.observer._handle_batch, "build")  # noqa: SLF001
    tracing.exporter.export = timed(tracing.exporter.export, "export")
    return spent


if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if len(sys.argv) == 3 and sys.argv[1] == "--receiver":
        receiver(sys.argv[2])
        sys.exit(0)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model directory (default: the demo model)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    anyio.run(main, p.parse_args())
