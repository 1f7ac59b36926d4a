"""The live console in a real browser: Debian's chromium, headless, driven by Playwright for Python.

The page loads with no console errors, a request made through the API appears in the waterfall
with its stages in order (timed on the server), and the playground streams a chat completion
with the three first-token moments kept apart. `/-/events` shows each key its own requests only.

Set CONSOLE_SCREENSHOTS=DIR to write the screenshots the docs use (docs/console*.png).
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest
from keys_util import write_keys
from playwright.async_api import async_playwright  # the test extra: a broken install is an error, not a skip

from modelcall.events import ToolExecuted
from modelcall.testing.server import server_for_test

# slow tier (`-m slow`, CI's second step): a real browser against a live server
pytestmark = [pytest.mark.anyio, pytest.mark.slow]

LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_path() -> str | None:
    for candidate in (os.environ.get("MODELCALL_CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium",
                      shutil.which("chromium-browser")):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


@pytest.fixture
async def browser_page(tmp_path):
    exe = chromium_path()
    if exe is None:
        pytest.skip("no chromium found (looked at $MODELCALL_CHROMIUM, chromium on PATH, /usr/bin/chromium); "
                    "install it with `apt-get install -y chromium` (.ci/run does)")

    async with async_playwright() as pw:
        ctx = await pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=exe, headless=True, args=LAUNCH_ARGS,
            viewport={"width": 1400, "height": 1000})
        try:
            page = ctx.pages[0] if ctx.pages else await ctx.new_page()
            page.problems = []  # console errors and uncaught exceptions
            page.on("console", lambda m: page.problems.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: page.problems.append(f"pageerror: {e}"))
            yield page
        finally:
            await ctx.close()


SYSTEM = ("You are a travel agent. Answer briefly, name one flight and one hotel, and ask before you book "
          "anything that costs money. Prices are in euros.")


async def chat(srv, text: str, task: str, max_tokens: int = 12) -> str:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
    body = {"model": srv.kernel.model_name, "messages": messages,
            "max_tokens": max_tokens, "stream": True}
    async with srv.client.post("/v1/chat/completions", json=body, headers={"x-modelcall-task-id": task}) as resp:
        assert resp.status == 200
        await resp.read()
        return resp.headers["X-Request-Id"].removeprefix("chatcmpl-")


def shoot_dir() -> Path | None:
    d = os.environ.get("CONSOLE_SCREENSHOTS")
    return Path(d) if d else None


async def test_console_page_waterfall_and_playground(browser_page):
    page = browser_page
    async with server_for_test() as srv:
        await page.goto(srv.url + "/console")
        await page.wait_for_function("() => document.getElementById('status').textContent === 'live'",
                                     timeout=15_000)
        assert await page.text_content("#model") == srv.kernel.model_name

        # a task of two model requests with a tool call between them (the runtime publishes ToolExecuted)
        first = await chat(srv, "Plan a trip to Lisbon.", "trip-42")
        await asyncio.sleep(0.05)
        srv.kernel.bus.publish([ToolExecuted(request_id=first, task_id="trip-42", call_id="call_1",
                                             name="search_flights", duration_s=0.04)])
        second = await chat(srv, "Plan a trip to Lisbon. Flights found: 3.", "trip-42", max_tokens=20)
        await chat(srv, "Say hello.", "other")

        row = f'.row[data-rid="{second}"]'
        await page.wait_for_selector(f'{row} .seg[data-stage="streaming"]', timeout=15_000)
        segs = await page.eval_on_selector_all(
            f"{row} .seg", "els => els.map(e => [e.dataset.stage, +e.dataset.start, +e.dataset.end])")
        assert [s[0] for s in segs] == ["queue", "prefill", "decode", "streaming"]
        for (_, a, b), (_, c, _) in zip(segs, segs[1:]):
            assert a <= b <= c + 1e-9  # each stage ends before the next begins, on the server's clock
        assert segs[-1][2] > segs[0][1]
        tool = await page.eval_on_selector_all(f'.row[data-rid="{first}"] .seg[data-stage="tools"]',
                                               "els => els.map(e => e.title)")
        assert tool and tool[0].startswith("tool search_flights: 40.0 ms")
        head = await page.text_content(".task-head")
        assert "task trip-42: 2 model request(s)" in head
        figs = await page.text_content(f"{row} .figs")
        assert figs.startswith("ttft ") and "length" in figs
        # the third request's Finished may still be on its way to the page: wait for it, not a race
        await page.wait_for_function("() => +document.getElementById('t-finished').textContent >= 3",
                                     timeout=15_000)

        # the playground streams one chat completion with its events beside the text
        await page.fill("#prompt", "Tell me about the sea.")
        await page.fill("#max-tokens", "24")
        await page.click("#send")
        await page.wait_for_function("() => document.querySelector('#play-events').textContent.includes('[DONE]')",
                                     timeout=20_000)
        await page.wait_for_function("() => document.getElementById('m-engine').textContent !== '—'",
                                     timeout=10_000)
        events = await page.eval_on_selector_all("#play-events li b", "els => els.map(e => e.textContent)")
        assert events[0] == "HTTP 200" and events[1] == "role" and "content" in events and events[-1] == "[DONE]"
        assert events.index("finish") > events.index("content")
        answer = await page.text_content("#answer")
        assert answer
        moments = {k: await page.text_content(f"#m-{k}") for k in ("engine", "event", "content", "itl", "gap")}
        assert all(v.endswith(" ms") for v in moments.values()), moments
        first_event, first_content = float(moments["event"][:-3]), float(moments["content"][:-3])
        assert first_event <= first_content  # the role chunk comes before any content text
        if shoot_dir():
            await asyncio.sleep(2)  # a few points on the KV chart
            await page.screenshot(path=str(shoot_dir() / "console.png"), full_page=True)
            await (await page.query_selector("#playground-section")).screenshot(
                path=str(shoot_dir() / "console-playground.png"))
        await page.goto("about:blank")  # the page's feed ends before the server shuts down
    assert page.problems == []


async def feed(srv, key: str, out: list, ready: asyncio.Event) -> None:
    async with srv.client.get("/-/events?types=RequestAdmitted,Finished",
                              headers={"Authorization": f"Bearer {key}"}) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if line.startswith(b"event: snapshot"):
                ready.set()
            elif line.startswith(b"data: {\"type\""):
                out.append(json.loads(line[6:]))


async def test_events_feed_shows_each_key_its_own_requests(tmp_path):
    keys = write_keys(tmp_path / "keys.toml", {"key-a": {"name": "alice"}, "key-b": {"name": "bob"}})
    async with server_for_test(plugin_config={"auth": {"api_keys": str(keys)}}) as srv:
        async with srv.client.get("/-/events") as resp:
            assert resp.status == 401  # key-protected
        async with srv.client.get("/console") as resp:
            assert resp.status == 200 and "Content-Security-Policy" in resp.headers  # the page holds no data
        async with srv.client.get("/-/events?types=Bogus", headers={"Authorization": "Bearer key-a"}) as resp:
            assert resp.status == 400 and "Bogus" in (await resp.json())["error"]["message"]
        seen_a, seen_b = [], []
        ready_a, ready_b = asyncio.Event(), asyncio.Event()
        tasks = [asyncio.create_task(feed(srv, "key-a", seen_a, ready_a)),
                 asyncio.create_task(feed(srv, "key-b", seen_b, ready_b))]
        await asyncio.wait_for(asyncio.gather(ready_a.wait(), ready_b.wait()), 10)
        body = {"model": srv.kernel.model_name, "prompt": "hi", "max_tokens": 2}
        for key in ("key-a", "key-b", "key-a"):
            async with srv.client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
                assert r.status == 200
        for _ in range(100):
            if sum(e["type"] == "Finished" for e in seen_a) == 2 and seen_b and seen_b[-1]["type"] == "Finished":
                break
            await asyncio.sleep(0.05)
        for t in tasks:
            t.cancel()
    assert [e["type"] for e in seen_a] == ["RequestAdmitted", "Finished"] * 2
    assert [e["type"] for e in seen_b] == ["RequestAdmitted", "Finished"]
    assert {e["caller"] for e in seen_a if e["type"] == "RequestAdmitted"} == {"alice"}
    assert {e["caller"] for e in seen_b if e["type"] == "RequestAdmitted"} == {"bob"}
    ids_a = {e["request_id"] for e in seen_a}
    assert not ids_a & {e["request_id"] for e in seen_b}


def test_a_lagging_viewer_loses_events_counted_never_blocking_the_engine():
    from modelcall.events import RequestAdmitted, TokensEmitted
    from modelcall.plugins.console.hub import ConsoleHub, Viewer

    hub = ConsoleHub()
    mine, other = Viewer("alice", None, capacity=3), Viewer("bob", None)
    hub.connect(mine)
    hub.connect(other)
    admitted = RequestAdmitted(request_id="r1", model="m", prompt_tokens=4, max_tokens=8, caller="alice")
    hub.on_lifecycle(admitted)
    for ev in (admitted, *(TokensEmitted(request_id="r1", token_ids=(1,), text="x") for _ in range(4))):
        hub.forward(ev)
    assert len(mine.queue) == 3 and mine.dropped == 2 and mine.wake.is_set()
    assert not other.queue  # bob never sees alice's request
    assert hub.snapshot("alice")["live"][0]["stage"] == "queue" and hub.snapshot("bob")["live"] == []
