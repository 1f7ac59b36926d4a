"""A request's own event stream: the engine pushes without waiting, the consumer reads at its pace.

NOTE: this is a deque rather than an anyio memory stream because a lagging consumer must see
its text deltas *merged* at the tail, never dropped, and anyio's buffer is not reachable for
that. Pushing is O(1) and never awaits; memory stays bounded because once the stream holds
`capacity` items, new token deltas fold into the last one.
"""
from __future__ import annotations

import asyncio
from collections import deque

import anyio

from modelcall.events.types import TERMINAL_EVENTS, Event, TokensEmitted, now


def merge_deltas(a: TokensEmitted, b: TokensEmitted) -> TokensEmitted:
    """One delta that says what `a` then `b` said (timestamp of the later one)."""
    logprobs = None if a.logprobs is None and b.logprobs is None else (a.logprobs or ()) + (b.logprobs or ())
    calls = None if a.tool_calls is None and b.tool_calls is None else (a.tool_calls or ()) + (b.tool_calls or ())
    return TokensEmitted(request_id=a.request_id, task_id=a.task_id, ts=b.ts, token_ids=a.token_ids + b.token_ids,
                         text=a.text + b.text, logprobs=logprobs, tool_calls=calls,
                         reasoning=a.reasoning + b.reasoning, reasoning_tokens=a.reasoning_tokens + b.reasoning_tokens)


class RequestStream:
    """Events of one request, in order, ending with its terminal event."""

    __slots__ = ("request_id", "capacity", "_items", "_waiter", "_done", "consumer_gone",
                 "lagging_since", "merged")

    def __init__(self, request_id: str, capacity: int = 64) -> None:
        self.request_id = request_id
        self.capacity = capacity
        self._items: deque[Event] = deque()
        self._waiter: asyncio.Future | anyio.Event | None = None
        self._done = False  # the terminal event has been handed to the consumer
        self.consumer_gone = False
        self.lagging_since: float | None = None
        self.merged = 0

    def put(self, event: Event) -> None:
        """Engine side: never blocks, never drops a delta."""
        if self.consumer_gone:
            return
        items = self._items
        if len(items) >= self.capacity and type(event) is TokensEmitted and items \
                and type(items[-1]) is TokensEmitted:
            items[-1] = merge_deltas(items[-1], event)
            self.merged += 1
            if self.lagging_since is None:
                self.lagging_since = now()
        else:
            items.append(event)
        w = self._waiter
        if w is not None:
            if not isinstance(w, asyncio.Future):
                w.set()
            elif not w.done():  # a consumer cancelled while it waited leaves its future cancelled
                w.set_result(None)

    def close(self) -> None:
        """Consumer side: it will read no more (the kernel aborts an unfinished request)."""
        self.consumer_gone = True
        self._items.clear()

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> Event:
        while not self._items:
            if self._done or self.consumer_gone:
                raise StopAsyncIteration
            # NOTE: on asyncio a bare future per wait (one allocation, set by put) instead of an anyio.Event,
            # which builds an asyncio.Event and its future each time: once per token per stream.
            try:
                waiter = self._waiter = asyncio.get_running_loop().create_future()
            except RuntimeError:  # another anyio backend
                self._waiter = anyio.Event()
                await self._waiter.wait()
            else:
                await waiter
            self._waiter = None
        event = self._items.popleft()
        if not self._items:
            self.lagging_since = None
        if isinstance(event, TERMINAL_EVENTS):
            self._done = True
        return event

    @property
    def finished(self) -> bool:
        return self._done
