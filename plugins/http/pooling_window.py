"""How one embeddings, rerank or score call feeds its inputs to the kernel: up to MAX_INPUTS of them (OpenAI's limit
per embeddings call; LangChain's OpenAIEmbeddings sends 1,000 a call by default), each one pooling request, through
a window of at most `max_sequences_per_call` in flight. The next input is admitted when one in flight finishes, so
one big call holds no more of the queue than a call of that many (max_queued and the scheduler's fairness hold for
the others) and still keeps the batches full.

    inputs  0 1 2 ... 63 | 64 65 ...          window 64: input 64 is admitted when any of 0..63 has finished
            ^ in flight  ^ waiting in the call, not in the kernel's queue

A refusal of input i (too long, a quota) aborts those in flight and admits no more; so does a client that hangs up
(aiohttp cancels the handler: the `finally` below closes every handle still open).
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from modelcall.core import Completion, RequestHandle
from modelcall.plugins.http.errors import ApiError
from modelcall.plugins.http.service import ServingContext

MAX_INPUTS = 2048   # OpenAI's limit on inputs per embeddings call; rerank documents and score pairs take as many


def check_call_size(n: int, field: str) -> None:
    """More than MAX_INPUTS inputs in one call is a 400 naming the limit, given before any input is admitted."""
    if n > MAX_INPUTS:
        raise ApiError(400, f"{field} has {n} items; one call takes at most {MAX_INPUTS} (OpenAI's limit per "
                       "embeddings request); send the rest in another call", param=field)


async def pool_all(ctx: ServingContext, n: int, admit: Callable[[int], Awaitable[RequestHandle]]) -> list[Completion]:
    """Admit inputs 0..n-1 (`admit(i)`: the kernel's handle of input i, or the ApiError that refuses it) through
    the window and return their completions in input order."""
    window = max(1, ctx.kernel.config.max_sequences_per_call)
    done: list[Completion | None] = [None] * n
    in_flight: dict[asyncio.Task, tuple[int, RequestHandle]] = {}
    following = 0
    try:
        while following < n or in_flight:
            while following < n and len(in_flight) < window:
                handle = await admit(following)
                in_flight[asyncio.ensure_future(handle.result())] = (following, handle)
                following += 1
            finished, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            for task in finished:
                i, _ = in_flight.pop(task)
                done[i] = task.result()
                if ctx.exchange is not None:
                    ctx.exchange.sequence_ended()   # its slot of the per-call cap goes to the next input
    finally:
        for task, (_, handle) in in_flight.items():
            task.cancel()
            handle.close()   # an unfinished input is aborted and its blocks freed
    return done   # type: ignore[return-value]  # every slot was filled: the loop ends when none is in flight
