"""The front-end side of the records: task ids and context policy in, response-sent time out.

A plugin of its own (entry point `exchange`, so blocking the ledger keeps it) adding an aiohttp
middleware to `modelcall serve` through `register_middlewares`:

* reads `x-modelcall-task-id`, `x-modelcall-retries` and the request option `context_policy`
  (JSON body field or `x-modelcall-context-policy` header) into the request's Exchange
  (`request[EXCHANGE_KEY]`, which the front end hands to the kernel), so the kernel records
  them with every request this HTTP request makes;
* after the handler, makes sure the response is fully written, then publishes `ResponseSent`
  for each admitted request (the ledger's `response_sent`, the report's streaming time);
* when a context policy dropped history to fit the window, says so in the
  `x-modelcall-context-dropped` header of a non-streamed response (a streamed one adds
  the exchange's `response_headers()` when it sends its headers).
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web

from modelcall.core import hookimpl
from modelcall.core.metering import EXCHANGE_KEY
from modelcall.events import ResponseSent

TASK_HEADER = "x-modelcall-task-id"
RETRIES_HEADER = "x-modelcall-retries"
POLICY_HEADER = "x-modelcall-context-policy"


def _policy_from_body(raw: bytes) -> str | None:
    if b"context_policy" not in raw:  # NOTE: skip the JSON parse for the common case
        return None
    try:
        body = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None
    policy = body.get("context_policy") if isinstance(body, dict) else None
    return policy if isinstance(policy, str) else None


def exchange_middleware(kernel: Any) -> Callable[..., Any]:
    @web.middleware
    async def records(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                      ) -> web.StreamResponse:
        if request.method != "POST":
            return await handler(request)
        headers = request.headers
        try:
            retries = max(0, int(headers.get(RETRIES_HEADER, "0")))
        except ValueError:
            retries = 0
        policy = headers.get(POLICY_HEADER)
        if policy is None and request.can_read_body:
            policy = _policy_from_body(await request.read())
        ex = request.get(EXCHANGE_KEY)
        if ex is None:  # not behind modelcall's front end: nothing to fill or to record
            return await handler(request)
        ex.task_id = ex.task_id or headers.get(TASK_HEADER) or None
        ex.context_policy, ex.retries = ex.context_policy or policy, ex.retries or retries
        response = await handler(request)
        handles = list(ex.handles)
        if not handles:
            return response
        if not response.prepared:  # headers not sent yet: say what a context policy dropped
            response.headers.update(ex.response_headers())
        status = response.status
        try:
            if not response.prepared:
                await response.prepare(request)
            await response.write_eof()
        except ConnectionError:  # the client left before the last byte: recorded as such (nginx's 499)
            status = 499
            raise
        finally:
            kernel.bus.publish([ResponseSent(request_id=h.request_id, task_id=h.task_id, status=status)
                                for h in handles])
        return response

    return records


@hookimpl(trylast=True)
def register_middlewares(register: Any, kernel: Any) -> None:
    register(exchange_middleware(kernel), order=-50)
