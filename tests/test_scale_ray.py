"""Replicas on Ray Serve (plugins/scale): two kernel replicas of the demo model on a local Ray
cluster behind the real aiohttp front end, driven by the real OpenAI SDK and raw SSE streams.

One cluster for the module (starting Ray and two replicas is most of its time); the tests run in
order and the last ones take replicas away (a kill, then the drain).
"""
from __future__ import annotations

import asyncio
import collections
import json
import os
import shutil
import sqlite3
import tempfile
import threading
import time
from typing import Any

import msgspec
import pytest

import ray  # noqa: E402  (the test extra's ray[serve]: a missing package is an error, not a skip)
import ray.serve  # noqa: E402,F401

import requests  # noqa: E402
import openai  # noqa: E402
from aiohttp import web  # noqa: E402

from lora_adapters import ADAPTERS, build_adapter, reference_outputs  # noqa: E402
from keys_util import write_keys  # noqa: E402
from redis_server import redis_server  # noqa: E402,F401 (the module-scoped fixture)
from modelcall.core import Kernel, KernelConfig  # noqa: E402
from modelcall.plugins.http.app import create_app  # noqa: E402
from modelcall.plugins.scale import deploy  # noqa: E402
from modelcall.plugins.scale.remote import REPLICA_HEADER, RemoteKernel  # noqa: E402

# slow tier (`-m slow`, CI's second step): starting Ray and two replicas is ~70 s of this module's ~90 s
pytestmark = pytest.mark.slow
BLOCKED = ("server_tools",)  # no MCP servers here; keeps the replicas' start-up to the kernel itself
SYSTEMS = [f"You are assistant number {i}. " + "Answer briefly and politely, in plain words. " * 6
           for i in range(8)]


def config(model_dir: str, ledger: str, lora_modules: dict[str, str] | None = None) -> KernelConfig:
    return KernelConfig(model=model_dir, max_model_len=512, num_kv_blocks=256, lora_modules=lora_modules or {},
                        runtime_lora_updates=bool(lora_modules), plugin_config={"ledger": {"path": ledger}})


class ReplicatedServer:
    """RemoteKernel (two replicas) + the app on loopback, on an event loop in a thread of its own."""

    def __init__(self, cfg: KernelConfig) -> None:
        self.kernel = RemoteKernel(cfg, blocked=BLOCKED, num_replicas=2, num_cpus=2)
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._up = threading.Event()
        self._error: BaseException | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ReplicatedServer:
        self._thread.start()
        self._up.wait(240)
        if self._error is not None:
            raise self._error
        assert self.port, "the replicated server did not start within 240 s"
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)

    def call(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        try:
            await self.kernel.start()
            runner = web.AppRunner(create_app(self.kernel), handler_cancellation=True)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = runner.addresses[0][1]
        except BaseException as e:
            self._error = e
            self._up.set()
            await self.kernel.stop()
            return
        self._up.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()
            await self.kernel.stop()


@pytest.fixture(scope="module")
def server(demo_model_dir: str) -> Any:
    tmp = tempfile.mkdtemp(prefix="mcscale-", dir="/tmp")
    saved = {k: os.environ.get(k) for k in ("HOME", "TMPDIR", "RAY_TMPDIR", "RAY_USAGE_STATS_ENABLED",
                                            "MODELCALL_CACHE_DIR")}
    # NOTE: Ray writes its session, logs and sockets under HOME/TMPDIR: all in one temp dir, removed after.
    # modelcall's cache stays where it was: under the temp HOME each replica compiled the C kernels anew
    # (~3 s CPU each, both on the one core the suite runs on) instead of loading the built ones.
    cache = os.environ.get("MODELCALL_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "modelcall")
    os.environ.update(HOME=tmp, TMPDIR=tmp, RAY_TMPDIR=tmp, RAY_USAGE_STATS_ENABLED="0", MODELCALL_CACHE_DIR=cache)
    cov = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("COV_CORE_")}  # no coverage in workers
    # LoRA through the replicas (issue 39): one adapter from the start, one to load at run time
    adapters = {name: build_adapter(demo_model_dir, os.path.join(tmp, name), seed=i + 1, **ADAPTERS[name])
                for i, name in enumerate(("qv8", "mlp8"))}
    t0 = time.monotonic()
    try:
        with ReplicatedServer(config(demo_model_dir, os.path.join(tmp, "ledger.sqlite3"),
                                     {"qv8": adapters["qv8"]})) as s:
            s.started_s = time.monotonic() - t0
            s.ledger = os.path.join(tmp, "ledger.sqlite3")
            s.model_dir = demo_model_dir
            s.adapters = adapters
            yield s
    finally:
        try:
            deploy.shutdown()  # idempotent: also when the server failed half-way
        finally:
            for k, v in {**saved, **cov}.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            shutil.rmtree(tmp, ignore_errors=True)


def chat(client: openai.OpenAI, system: str, user: str, max_tokens: int = 4) -> tuple[str, Any]:
    raw = client.chat.completions.with_raw_response.create(
        model=client.models.list().data[0].id, messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
        max_tokens=max_tokens, temperature=0)
    return raw.headers[REPLICA_HEADER], raw.parse()


def replica_stats(server: ReplicatedServer) -> dict[str, dict]:
    return server.call(server.kernel.replica_stats())


def test_shared_prefixes_stay_on_one_replica_hit_its_cache_and_match_one_kernel(server: ReplicatedServer) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    name = server.kernel.model_name
    asks = [(i, f"question {r} about topic {i}?") for r in range(4) for i in range(len(SYSTEMS))]
    seen: dict[int, list[str]] = collections.defaultdict(list)
    cached: dict[tuple[int, str], int] = {}
    served_by: dict[tuple[int, str], str] = {}

    def one(ask: tuple[int, str]) -> None:
        i, q = ask
        raw = client.chat.completions.with_raw_response.create(
            model=name, messages=[{"role": "system", "content": SYSTEMS[i]}, {"role": "user", "content": q}],
            max_tokens=4, temperature=0)
        seen[i].append(raw.headers[REPLICA_HEADER])
        served_by[(i, q)] = raw.headers[REPLICA_HEADER]
        cached[(i, q)] = raw.parse().usage.prompt_tokens_details.cached_tokens

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:  # a round of 8 prompts, 4 at a time; rounds in order
        for r in range(4):
            list(pool.map(one, asks[r * len(SYSTEMS):(r + 1) * len(SYSTEMS)]))
    on_home = sum(collections.Counter(v).most_common(1)[0][1] for v in seen.values())
    assert on_home / len(asks) >= 0.95, dict(seen)
    replicas = {r for v in seen.values() for r in v}
    assert len(replicas) == 2, f"both replicas should take work: {dict(seen)}"
    repeats = [cached[a] for a in asks[len(SYSTEMS):]]
    assert sum(c > 0 for c in repeats) / len(repeats) >= 0.90, repeats

    # The same requests, in the same order, on one kernel: the same cached tokens each.
    async def one_kernel() -> dict[tuple[int, str], int]:
        out = {}
        cfg = KernelConfig(model=server.model_dir, max_model_len=512, num_kv_blocks=256)
        async with Kernel(cfg, blocked=BLOCKED) as k:
            for r in range(4):
                for i, q in asks[r * len(SYSTEMS):(r + 1) * len(SYSTEMS)]:
                    done = await k.complete(messages=[{"role": "system", "content": SYSTEMS[i]},
                                                      {"role": "user", "content": q}], max_tokens=4, temperature=0)
                    out[(i, q)] = done.usage.cached_tokens
        return out

    # Every request served by its prefix's home replica (all but the <= 5% the router spread) reports
    # exactly what one kernel reports for it.
    home = {i: collections.Counter(v).most_common(1)[0][0] for i, v in seen.items()}
    on_one = asyncio.run(one_kernel())
    at_home = [a for a in asks if served_by[a] == home[a[0]]]
    assert len(at_home) >= 0.95 * len(asks)
    assert {a: cached[a] for a in at_home} == {a: on_one[a] for a in at_home}
    assert sum(on_one[a] > 0 for a in asks[len(SYSTEMS):]) == len(asks) - len(SYSTEMS)  # the reference hits


def test_one_metrics_and_one_ledger_cover_every_replica(server: ReplicatedServer) -> None:
    text = requests.get(server.url + "/metrics", timeout=60).text
    per_replica = {}
    for line in text.splitlines():
        if line.startswith("modelcall:replica_requests_total{"):
            rid = line.split('replica="', 1)[1].split('"', 1)[0]
            per_replica[rid] = float(line.rsplit(" ", 1)[1])
    assert len(per_replica) == 2 and sum(per_replica.values()) >= 32, per_replica
    assert 'modelcall:replica_kv{' in text and 'stat="num_free_blocks"' in text
    # The front end's own series (the metrics plugin) count every replica's requests: the sums agree.
    def total(prefix: str) -> float:
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(prefix + "{"))

    assert total("modelcall:cached_prompt_tokens_total") == total("modelcall:replica_cached_tokens_total") > 0
    assert total("modelcall:prompt_tokens_total") == total("modelcall:replica_prompt_tokens_total") > 0
    deadline = time.monotonic() + 10
    while True:  # the ledger writes through its own queue
        with sqlite3.connect(server.ledger) as conn:
            rows = conn.execute("SELECT count(*), sum(cached_tokens > 0) FROM requests WHERE status = 200").fetchone()
        if rows[0] >= 32 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert rows[0] >= 32 and rows[1] >= 24, rows


LORA_PROMPTS = [[5, 17, 300, 42, 9, 77, 1000, 12], [44, 45, 46, 900, 3], [700, 8, 1500, 33, 61, 2000]]


def test_lora_adapters_reach_every_replica_and_load_on_all_of_them(server: ReplicatedServer) -> None:
    """--lora-modules loads on each replica, /v1/models lists it with its parent, the request's `model` runs on
    it (PEFT's merged output); a runtime load and unload reach every replica, and a bad load is undone on all."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    ids = sorted(replica_stats(server))

    def on_each() -> list[list[str]]:   # the adapters each replica itself serves, asked of it (pinned)
        return [[a["name"] for a in server.call(server.kernel._pinned("describe", r))["loras"]] for r in ids]

    def texts(model: str) -> list[str]:
        return [client.completions.create(model=model, prompt=p, max_tokens=8, temperature=0,
                                          extra_body={"ignore_eos": True}).choices[0].text for p in LORA_PROMPTS]

    def wanted(adapter: str | None) -> list[str]:
        refs = reference_outputs(server.model_dir, server.adapters.get(adapter), LORA_PROMPTS, 8)
        return [server.kernel.tokenizer.decode(r, skip_special_tokens=True) for r in refs]

    listed = {m.id: m.model_extra for m in client.models.list().data}
    assert listed["qv8"]["parent"] == server.kernel.model_name and on_each() == [["qv8"], ["qv8"]]
    assert texts("qv8") == wanted("qv8") != wanted(None)

    load = {"lora_name": "mlp8", "lora_path": server.adapters["mlp8"]}
    r = requests.post(server.url + "/v1/load_lora_adapter", json=load, timeout=60)
    assert r.status_code == 200 and "added" in r.text, r.text
    assert on_each() == [["qv8", "mlp8"], ["qv8", "mlp8"]] and "mlp8" in {m.id for m in client.models.list().data}
    assert texts("mlp8") == wanted("mlp8")
    r = requests.post(server.url + "/v1/unload_lora_adapter", json={"lora_name": "mlp8"}, timeout=60)
    assert r.status_code == 200 and on_each() == [["qv8"], ["qv8"]]
    with pytest.raises(openai.NotFoundError):
        texts("mlp8")
    bad = requests.post(server.url + "/v1/load_lora_adapter", json={"lora_name": "bad", "lora_path": server.model_dir},
                        timeout=60)
    assert bad.status_code == 400 and "adapter_config.json" in bad.json()["error"]["message"], bad.text
    assert on_each() == [["qv8"], ["qv8"]] and "bad" not in {m.id for m in client.models.list().data}


def stream_chat(url: str, system: str, max_tokens: int, got: list, stop_after: int | None = None) -> None:
    """One streamed chat; appends ('header', replica, status), then ('token', n) per content delta,
    ('finish', reason), and ('done', n) or ('error', msg)."""
    body = {"model": "demo-model-1", "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "go on"}]}
    n = 0
    try:
        with requests.post(url + "/v1/chat/completions", json=body, timeout=120, stream=True) as r:
            got.append(("header", r.headers.get(REPLICA_HEADER), r.status_code))
            for line in r.iter_lines(decode_unicode=True):
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    got.append(("error", chunk["error"]["message"]))
                    return
                choice = (chunk.get("choices") or [{}])[0]
                if choice.get("finish_reason"):
                    got.append(("finish", choice["finish_reason"]))
                if choice.get("delta", {}).get("content"):
                    n += 1
                    got.append(("token", n))
                    if stop_after is not None and n >= stop_after:
                        return  # leaving the with-block closes the connection: the client is gone
        got.append(("done", n))
    except requests.RequestException as e:
        got.append(("error", f"{type(e).__name__}: {e}"))


def test_a_client_that_leaves_aborts_its_request_on_the_replica(server: ReplicatedServer) -> None:
    got: list = []
    stream_chat(server.url, SYSTEMS[0], 300, got, stop_after=3)
    home = got[0][1]
    deadline = time.monotonic() + 20
    while True:
        s = replica_stats(server)[home]
        if s["unfinished"] == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert s["unfinished"] == 0 and s["kv"]["num_free_blocks"] == s["kv"]["num_blocks"], s
    assert server.kernel.stats()["unfinished"] == 0


def test_a_killed_replica_fails_its_streams_cleanly_and_the_survivor_takes_new_work(server: ReplicatedServer) -> None:
    home = chat(openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0), SYSTEMS[1], "hi")[0]
    streams = [[] for _ in range(4)]
    threads = [threading.Thread(target=stream_chat, args=(server.url, SYSTEMS[1], 300, g)) for g in streams]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while not all(len(g) >= 3 for g in streams) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(g[0][1] == home for g in streams), streams
    survivor = next(r for r in replica_stats(server) if r != home)
    ray.kill(ray.get_actor(f"SERVE_REPLICA::{deploy.APP}#{deploy.DEPLOYMENT}#{home}", namespace="serve"),
             no_restart=True)
    for t in threads:
        t.join(90)
    for g in streams:  # each in-flight stream ends with an error event naming what happened, none hangs
        assert g[-1][0] == "error" and "replica" in g[-1][1], g[-3:]
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    after = [chat(client, SYSTEMS[1], f"again {i}")[0] for i in range(4)]
    assert home not in after, after
    assert survivor in after, after
    deadline = time.monotonic() + 20
    while True:  # nothing leaks: on the survivor, and in the front end (no request left in flight)
        s = replica_stats(server).get(survivor, {})
        if (s.get("unfinished") == 0 and server.kernel.stats()["unfinished"] == 0) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert s["unfinished"] == 0 and s["running"] == 0 and s["waiting"] == 0, s
    assert s["kv"]["num_free_blocks"] == s["kv"]["num_blocks"], s["kv"]
    assert server.kernel.stats()["unfinished"] == 0 and not server.kernel.bus._streams  # noqa: SLF001


def test_drain_refuses_new_requests_everywhere_and_lets_running_ones_finish(server: ReplicatedServer) -> None:
    got: list = []
    t = threading.Thread(target=stream_chat, args=(server.url, SYSTEMS[2], 24, got))
    t.start()
    deadline = time.monotonic() + 60
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    drained = server.call(server.kernel.drain(60.0), timeout=90)
    t.join(60)
    assert drained and got[-2] == ("finish", "length") and got[-1][0] == "done", got[-3:]
    r = requests.post(server.url + "/v1/chat/completions", timeout=30,
                   json={"model": "demo-model-1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 503 and r.json()["error"]["message"], r.text
    assert all(not s["ready"] for s in replica_stats(server).values())
    assert requests.get(server.url + "/ready", timeout=10).status_code == 503


# ---- the quota store through the replicas (issue 41): last, on the same cluster, redeployed ---------

QUOTA_KEY, PROBE_KEY, RPM = "mc-ray-quota-key", "mc-ray-probe-key", 3


@pytest.fixture(scope="module")
def quota_server(server: ReplicatedServer, redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:  # noqa: F811
    """The module's cluster once the tests above are done (the last one drained the replicas), redeployed
    with API keys and one redis-server as the quota store: every replica charges it (fail closed)."""
    keys = write_keys(tmp_path_factory.mktemp("raykeys") / "keys.toml", {   # one cache group: the same routes
        QUOTA_KEY: {"name": "rayq", "rpm": RPM, "cache_group": "g"}, PROBE_KEY: {"name": "probe", "cache_group": "g"}})
    cfg = msgspec.structs.replace(config(server.model_dir, server.ledger), plugin_config={
        "ledger": {"path": server.ledger}, "auth": {"api_keys": str(keys), "quota_store": redis_server.url}})
    with ReplicatedServer(cfg) as s:
        yield s


def quota_gauges(server: ReplicatedServer) -> dict[tuple[str, str], float]:
    """(series, replica) -> value of the quota store's gauges on the front end's one /metrics."""
    text = requests.get(server.url + "/metrics", headers={"Authorization": f"Bearer {PROBE_KEY}"}, timeout=60).text
    return {(line.split("{", 1)[0], line.split('replica="', 1)[1].split('"', 1)[0]): float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith("modelcall:quota_store_") and 'replica="' in line}


def test_replicas_charge_one_quota_store_and_its_gauges_reach_the_front_end(quota_server: ReplicatedServer,
                                                                          redis_server: Any) -> None:  # noqa: F811
    probe = openai.OpenAI(base_url=quota_server.url + "/v1", api_key=PROBE_KEY, max_retries=0, timeout=60)
    limited = openai.OpenAI(base_url=quota_server.url + "/v1", api_key=QUOTA_KEY, max_retries=0, timeout=60)
    home = {i: chat(probe, SYSTEMS[i], "where")[0] for i in range(len(SYSTEMS))}   # each system's replica
    ids = sorted(set(home.values()))
    assert len(ids) == 2, home
    alternating = [next(i for i in home if home[i] == r) for r in ids]   # one system homed on each replica
    t0 = time.monotonic()
    served, refused = [], []

    def ask(n: int) -> None:
        for k in range(n):
            try:
                served.append(chat(limited, SYSTEMS[alternating[k % 2]], f"quota {k}")[0])
            except openai.RateLimitError as e:
                assert e.response.headers.get("Retry-After"), e.response.headers
                refused.append(e.message)

    def bucket() -> int:   # what a token bucket of RPM allows since the storm began
        return RPM + int(RPM * (time.monotonic() - t0) / 60)

    ask(4 * RPM)   # a storm of 4 x the key's requests per minute, over both replicas in turn
    assert set(served) == set(ids), served                # both replicas admitted some: both charge the store
    assert len(served) <= bucket(), served                # their sum: counting alone, each would admit RPM
    assert len(refused) == 4 * RPM - len(served) and "requests per minute" in refused[0]
    gauges = quota_gauges(quota_server)
    assert {g for g in gauges if g[0] == "modelcall:quota_store_up"} == {("modelcall:quota_store_up", r) for r in ids}
    assert all(v == 1.0 for (name, _), v in gauges.items() if name == "modelcall:quota_store_up"), gauges

    redis_server.kill()
    for i in alternating:   # fail closed: both replicas refuse with 503 and say why
        with pytest.raises(openai.APIStatusError) as down:
            chat(limited, SYSTEMS[i], "down")
        assert down.value.status_code == 503 and "cannot be reached" in down.value.message
    gauges = quota_gauges(quota_server)
    assert all(gauges[("modelcall:quota_store_up", r)] == 0.0 and gauges[("modelcall:quota_store_errors", r)] >= 1
               for r in ids), gauges

    redis_server.start()   # its append-only file kept the buckets
    time.sleep(1.1)        # a replica does not ask the store again for a second after a failure
    ask(2)
    assert len(served) <= bucket(), served   # the buckets Redis kept: not a fresh RPM after the restart
    assert all(quota_gauges(quota_server)[("modelcall:quota_store_up", r)] == 1.0 for r in ids)
