"""Many clients at once: disconnecting clients free their requests at once, and admission answers
429 with Retry-After instead of queueing without bound."""
from __future__ import annotations

import asyncio
import json
import random
import time

import aiohttp
import pytest
from http_server import ServerThread

from modelcall.core import hookimpl
from modelcall.events import Finished, RequestAdmitted, StepDone, TokensEmitted
from modelcall.plugins.http.settings import ServerSettings
from modelcall.testing import EventCollector


async def stream_chat(session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int,
                      stop_after: int | None = None, on_hangup=None) -> str | None:
    """The streamed answer, or None when this client hung up after `stop_after` content deltas
    (`on_hangup(request_id)` is called just before)."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True}
    if stop_after is not None:  # NOTE: a leaver must still be generating when it hangs up, whatever it draws
        body["ignore_eos"] = True
    parts: list[str] = []
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            delta = chunk["choices"]
            if delta and delta[0]["delta"].get("content"):
                parts.append(delta[0]["delta"]["content"])
                if stop_after is not None and len(parts) >= stop_after:
                    if on_hangup is not None:
                        on_hangup(chunk["id"].removeprefix("chatcmpl-"))
                    resp.close()  # hang up mid-stream
                    return None
    return "".join(parts)


async def run_clients(url: str, prompts: list[str], max_tokens: int, stop_after: dict[int, int],
                      leaver_max_tokens: int | None = None, on_hangup=None) -> list[str | None]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        return await asyncio.gather(*(stream_chat(session, url, p, leaver_max_tokens if i in stop_after and
                                                  leaver_max_tokens else max_tokens, stop_after.get(i), on_hangup)
                                      for i, p in enumerate(prompts)))


async def cancel_whole_requests(url: str, n: int, max_tokens: int, generating, on_cancel) -> None:
    """Non-streaming clients that give up while their answer is being generated: once `generating()`
    (the server's own count of these requests that have emitted tokens) reaches n."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def one(i: int) -> None:
            # NOTE: ignore_eos: a sampled EOS would end one of them "stop" before the cancel (seen once in CI)
            body = {"messages": [{"role": "user", "content": f"long answer {i}"}], "max_tokens": max_tokens,
                    "ignore_eos": True}
            async with session.post(url + "/v1/chat/completions", json=body) as resp:
                await resp.read()
        tasks = [asyncio.ensure_future(one(i)) for i in range(n)]
        deadline = time.monotonic() + 120
        while generating() < n and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        on_cancel()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def wait_idle(server: ServerThread, within_s: float = 60.0) -> dict:
    """The server's stats once it is idle with every block free (or after `within_s`: a deadline for a
    hung test, not a speed claim; what the tests count is the work done)."""
    t0 = time.monotonic()
    while True:
        s = server.stats()
        idle = s["unfinished"] == 0 and s["running"] == 0 and s["waiting"] == 0 \
            and s["kv"]["num_free_blocks"] == s["kv"]["num_blocks"]
        if idle or time.monotonic() - t0 > within_s:
            return {**s, "idle": idle}
        time.sleep(0.01)


def last_step(events: EventCollector) -> int:
    return next((e.step for e in reversed(events.events) if type(e) is StepDone), 0)


class Generating:
    """How many requests admitted with `max_tokens` have emitted tokens, reading only the events that
    came since the last call (it is polled while the server runs: a scan of them all would compete with it)."""

    def __init__(self, events: EventCollector, max_tokens: int) -> None:
        self.events, self.max_tokens, self.read = events, max_tokens, 0
        self.admitted: set[str] = set()
        self.emitting: set[str] = set()

    def __call__(self) -> int:
        new = self.events.events[self.read:]
        self.read += len(new)
        for e in new:
            if type(e) is RequestAdmitted and e.max_tokens == self.max_tokens:
                self.admitted.add(e.request_id)
            elif type(e) is TokensEmitted and e.request_id in self.admitted:
                self.emitting.add(e.request_id)
        return len(self.emitting)


def steps_until_finished(events: EventCollector, request_id: str, since_step: int) -> int:
    """How many engine steps ran after step `since_step` before the request finished: the work the
    server kept doing for it."""
    n = 0
    for e in list(events.events):
        if type(e) is StepDone and e.step > since_step:
            n += 1
        elif type(e) is Finished and e.request_id == request_id:
            return n
    raise AssertionError(f"request {request_id} never finished")


def finished_with(events: EventCollector, max_tokens: int) -> list[Finished]:
    """The Finished events of the requests admitted with `max_tokens` (how the tests mark their leavers)."""
    ids = {e.request_id for e in events.of(RequestAdmitted) if e.max_tokens == max_tokens}
    return [e for e in events.of(Finished) if e.request_id in ids]


def test_disconnecting_clients_free_everything_and_do_not_disturb_the_others():
    prompts = [f"Client {i} asks: tell me about number {i * 7}" for i in range(100)]
    rng = random.Random(7)
    leavers = {i: rng.randint(1, 20) for i in rng.sample(range(100), 30)}
    events = EventCollector()
    with ServerThread(ServerSettings(port=0), plugins=(events,), num_kv_blocks=2048) as server:
        calm = asyncio.run(run_clients(server.base_url, prompts, 24, {}))
        assert all(calm) and len(set(calm)) > 50
        # NOTE: the leavers ask for 200 tokens, the others for 24: a request that outlived its client
        # would run on to 200 and finish "length". "At once" is counted in engine steps, not seconds.
        hung: dict[str, int] = {}   # request id -> the server's last step when its client hung up
        disturbed = asyncio.run(run_clients(server.base_url, prompts, 24, leavers, leaver_max_tokens=200,
                                            on_hangup=lambda rid: hung.setdefault(rid, last_step(events))))
        stats = wait_idle(server)
        assert stats["idle"], f"the clients left and work is still held: {stats}"
        left = finished_with(events, 200)
        assert len(left) == 30 and {e.reason for e in left} == {"abort"}, [(e.reason, e.usage) for e in left]
        assert set(hung) == {e.request_id for e in left}
        after = {rid: steps_until_finished(events, rid, step) for rid, step in hung.items()}
        print(f"engine steps after a hang-up: at most {max(after.values())}")
        assert max(after.values()) <= 16, f"engine steps run for a request after its client hung up: {after}"
        assert [d for i, d in enumerate(disturbed) if i not in leavers] == \
               [c for i, c in enumerate(calm) if i not in leavers]
        assert all(disturbed[i] is None for i in leavers)

        cancelled: list[int] = []
        asyncio.run(cancel_whole_requests(server.base_url, 10, 199, Generating(events, 199),
                                          lambda: cancelled.append(last_step(events))))
        stats = wait_idle(server)
        assert stats["idle"], f"non-streaming clients that left still hold work: {stats}"
        left = finished_with(events, 199)
        assert len(left) == 10 and {e.reason for e in left} == {"abort"}, [(e.reason, e.usage) for e in left]
        after = {e.request_id: steps_until_finished(events, e.request_id, cancelled[0]) for e in left}
        print(f"engine steps after a cancel: at most {max(after.values())}")
        assert max(after.values()) <= 16, f"engine steps run for a request after its client left: {after}"


class RunningMeter:
    modelcall_plugin_name = "test-running-meter"

    def __init__(self) -> None:
        self.max_running = self.max_waiting = 0

    def on_step(self, ev: StepDone) -> None:
        self.max_running = max(self.max_running, ev.num_running)
        self.max_waiting = max(self.max_waiting, ev.num_waiting)

    @hookimpl
    def register_observers(self, register):
        register(StepDone, self.on_step)


async def burst(url: str, n: int) -> list[tuple[int, str | None]]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def one(i: int) -> tuple[int, str | None]:
            body = {"messages": [{"role": "user", "content": f"burst {i}"}], "max_tokens": 16}
            async with session.post(url + "/v1/chat/completions", json=body) as resp:
                payload = await resp.json()
                if resp.status == 429:
                    assert payload["error"]["type"] == "rate_limit_error", payload
                return resp.status, resp.headers.get("Retry-After")
        return await asyncio.gather(*(one(i) for i in range(n)))


def test_a_burst_gets_only_200s_and_429s_with_retry_after_and_never_more_than_max_running():
    meter = RunningMeter()
    with ServerThread(ServerSettings(port=0), plugins=(meter,), max_num_seqs=8, max_queued=4) as server:
        results = [r for _ in range(2) for r in asyncio.run(burst(server.base_url, 100))]
        statuses = [s for s, _ in results]
        assert set(statuses) == {200, 429}, statuses
        assert all(int(ra) >= 1 for s, ra in results if s == 429)
        assert meter.max_running == 8  # the limit was reached, never passed
        assert meter.max_waiting <= 4 and statuses.count(200) >= 12
        stats = wait_idle(server)
        assert stats["idle"], stats
