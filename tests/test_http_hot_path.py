"""The streaming hot path never waits on a slow observer: tokens reach an SSE client while an
offloaded observer (a database, a network sink) is still far behind, with async scheduling on and off."""
from __future__ import annotations

import json
import threading

import pytest

from modelcall.core import hookimpl
from modelcall.events import OffloadedObserver, TokensEmitted

pytestmark = pytest.mark.anyio

TOKENS = 12


class SlowSink:
    """On its own worker thread, stuck on each token event (up to STUCK_S) until the test lets it go, as a
    store that has stopped answering would be; then it catches up.

    NOTE: a fixed sleep per event (0.2 s) made the test wait ~2.4 s for a sink it had already outrun; stuck
    until released, an engine or handler that waited for the sink would stall STUCK_S per event and the
    sink would have handled them all by the stream's end (the `behind` assertion fails)."""

    STUCK_S = 5.0

    def __init__(self) -> None:
        self.handled = 0
        self.lock = threading.Lock()
        self.released = threading.Event()
        self.observer = OffloadedObserver(self._handle, name="test-slow-sink")

    def _handle(self, ev: object) -> None:
        self.released.wait(self.STUCK_S)
        with self.lock:
            self.handled += 1

    @hookimpl
    def register_observers(self, register) -> None:
        register(TokensEmitted, self.observer, name="test.slow_sink")


@pytest.mark.parametrize("overlap", [True, False])
async def test_a_stream_ends_long_before_a_slow_observer_catches_up(live_server, overlap):
    sink = SlowSink()
    async with live_server(plugins=[sink], async_scheduling=overlap) as server:
        body = {"model": server.kernel.model_name, "prompt": [11, 12, 13, 14], "max_tokens": TOKENS,
                "min_tokens": TOKENS, "ignore_eos": True, "temperature": 0, "stream": True}
        texts = 0
        async with server.client.post("/v1/completions", json=body) as resp:
            assert resp.status == 200
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    texts += bool(json.loads(line[6:])["choices"][0]["text"])
        with sink.lock:
            behind = TOKENS - sink.handled
        sink.released.set()
        sink.observer.flush(timeout=10)
    assert texts >= TOKENS - 2            # every token streamed (a token may decode to no text yet)
    # NOTE: had the engine or the handler waited for the sink, it would have handled all 12 by now
    assert behind > TOKENS // 2, f"the observer was only {behind} events behind when the stream ended"
    assert sink.handled == TOKENS         # and it still gets every event, in its own time
