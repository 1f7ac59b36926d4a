"""The OpenAI Responses API: POST /v1/responses (whole, streamed, background), GET / DELETE
/v1/responses/{id}, POST /v1/responses/{id}/cancel, GET /v1/responses/{id}/input_items.

A response runs the provider-side tool loop (`responses_loop`) over kernel requests admitted
exactly as chat's are; its items and stream events come from one `OutputBuilder`. Stored
responses (`store`, default true) live in a bounded SQLite store owned by the caller's key.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import msgspec
from aiohttp import web

from modelcall.core.metering import EXCHANGE_KEY, Caller
from modelcall.core.tools import ServerToolbox, toolbox_of
from modelcall.events import ResponseSent, Usage
from modelcall.plugins.http import sse
from modelcall.plugins.http.errors import ApiError
from modelcall.plugins.http.responses_loop import LoopResult, run_loop
from modelcall.plugins.http.responses_output import OutputBuilder
from modelcall.plugins.http.responses_plan import Plan, plan_of, response_id_for
from modelcall.plugins.http.responses_store import ResponseStore
from modelcall.plugins.http.schemas_responses import ResponsesRequest, encoder
from modelcall.plugins.http.service import ServingContext
from modelcall.plugins.http.tool_calls import task_id_of

log = logging.getLogger("modelcall.http.responses")


class ResponsesState:
    """Per app: the store, the background responses still running, and the hosted tools."""

    def __init__(self, store: ResponseStore, toolbox: ServerToolbox | None) -> None:
        self.store = store
        self.toolbox = toolbox
        self.background: dict[str, asyncio.Task] = {}


STATE = web.AppKey("modelcall.responses", ResponsesState)


def setup(app: web.Application, kernel: Any) -> None:
    """Give `app` the Responses routes' state; background responses are cancelled on cleanup."""
    state = ResponsesState(ResponseStore.from_config(kernel.config.plugin_config), toolbox_of(kernel))
    app[STATE] = state
    orphans = state.store.fail_unfinished("the server restarted while this background response ran")
    if orphans:
        log.warning("%d background response(s) of a previous run were left unfinished; marked failed", orphans)

    async def cleanup(_app: web.Application) -> None:
        for task in list(state.background.values()):
            task.cancel()
        for task in list(state.background.values()):
            with contextlib.suppress(BaseException):
                await task
        state.store.close()

    app.on_cleanup.append(cleanup)


def caller_of(exchange: Any) -> Caller | None:
    return getattr(exchange, "caller", None)


def _owner(exchange: Any) -> str:
    """The store's owner of what this exchange makes or reads: the key's name ("" without keys)."""
    caller = caller_of(exchange)
    return caller.name if caller is not None else ""


def _not_found(response_id: str) -> ApiError:
    return ApiError(404, f"Response with id {response_id!r} not found.", error_type="invalid_request_error",
                    param="response_id", code="not_found")


# ---- POST /v1/responses -----------------------------------------------------------------------------

async def create(request: web.Request, ctx: ServingContext, body: ResponsesRequest) -> web.StreamResponse:
    """Create a model response (OpenAI Responses API)."""
    state = request.app[STATE]
    model = ctx.check_model(body.model, lora=True)
    owner = _owner(ctx.exchange)
    history: list[dict[str, Any]] = []
    if body.previous_response_id is not None:
        prev = state.store.get(body.previous_response_id, owner)
        if prev is None:
            raise ApiError(404, f"Previous response with id {body.previous_response_id!r} not found.",
                           param="previous_response_id", code="previous_response_not_found")
        if prev.status in ("queued", "in_progress"):
            raise ApiError(400, f"previous response {prev.id!r} is still {prev.status}; wait for it to finish",
                           param="previous_response_id")
        history = prev.conversation
    if body.background and not body.store:
        raise ApiError(400, "background responses must be stored: send store true", param="background")
    if body.background and body.stream:
        raise ApiError(400, "background streaming is not supported; poll GET /v1/responses/{id}", param="stream")
    rid = response_id_for(owner, request.headers.get("Idempotency-Key"))
    plan = plan_of(body, rid, history, state.toolbox, caller_of(ctx.exchange))
    task_id = task_id_of(request) or rid  # NOTE: `modelcall report <response id>` then shows this response's passes
    base = _skeleton(body, plan, model)
    builder = OutputBuilder(plan.hosted.get)
    run = _Runner(ctx, state, body, plan, builder, base, owner, task_id)
    if body.background:
        return await run.background()
    if body.stream:
        return await run.stream(request)
    return await run.whole()


class _Runner:
    """One response: the loop, its final body, and storing it."""

    def __init__(self, ctx: ServingContext, state: ResponsesState, body: ResponsesRequest, plan: Plan,
                 builder: OutputBuilder, base: dict[str, Any], owner: str, task_id: str) -> None:
        self.ctx, self.state, self.body, self.plan = ctx, state, body, plan
        self.builder, self.base, self.owner, self.task_id = builder, base, owner, task_id

    async def loop(self, flush: Any) -> LoopResult:
        return await run_loop(self.ctx, self.plan, self.builder, self.state.toolbox, flush, task_id=self.task_id,
                              priority=self.body.priority, cache_salt=self.body.cache_salt)

    def final(self, result: LoopResult | None, status: str | None = None, error: dict | None = None) -> dict[str, Any]:
        out = {**self.base, "output": self.builder.items}
        if result is not None:
            out["usage"] = usage_of(result.usage)
            out["status"] = status or result.status
            if result.incomplete_reason is not None:
                out["incomplete_details"] = {"reason": result.incomplete_reason}
        else:
            out["status"] = status or "failed"
        if error is not None:
            out["error"] = error
        return out

    def save(self, response: dict[str, Any]) -> None:
        if self.body.store:
            self.state.store.put(self.owner, response, self.plan.input, self.plan.history)

    async def whole(self) -> web.Response:
        async def flush() -> None:
            self.builder.take_events()

        try:
            response = self.final(await self.loop(flush))
        except ApiError as e:
            if not self.builder.items:
                raise  # refused before anything ran: an HTTP error
            # NOTE: hosted tools already ran: the client gets what happened, as a failed response
            response = self.final(None, "failed", {"code": e.code or e.error_type, "message": e.message})
        self.save(response)
        return web.Response(body=encoder.encode(response), content_type="application/json")

    async def stream(self, request: web.Request) -> web.StreamResponse:
        out = sse.SSEWriter(request)
        b = self.builder
        start = {**self.base, "status": "in_progress"}
        b.emit("response.created", response=start)
        b.emit("response.in_progress", response=start)

        async def flush() -> None:
            events = b.take_events()
            if not out.response.prepared:
                await out.prepare({"X-Request-Id": self.plan.response_id})
            if events:
                await out.send(*(sse.event_frame(e["type"].encode(), encoder.encode(e)) for e in events))

        try:
            result = await self.loop(flush)
        except ApiError as e:
            if not out.response.prepared:
                raise  # refused before anything was streamed (e.g. a quota): an HTTP error, not an event
            response = self.final(None, "failed", {"code": e.code or e.error_type, "message": e.message})
            self.save(response)
            b.emit("response.failed", response=response)
        except Exception as e:
            if not out.response.prepared:
                raise
            log.exception("streamed response %s failed", self.plan.response_id)  # a bug: the stream still ends well
            response = self.final(None, "failed", {"code": "server_error", "message": f"internal error "
                                                   f"({type(e).__name__}); see the server log"})
            self.save(response)
            b.emit("response.failed", response=response)
        else:
            response = self.final(result)
            self.save(response)
            b.emit("response.completed" if response["status"] == "completed" else "response.incomplete",
                   response=response)
        await flush()
        await out.close()
        return out.response

    async def background(self) -> web.Response:
        queued = {**self.base, "status": "queued"}
        self.save(queued)
        rid = self.plan.response_id

        async def flush() -> None:
            self.builder.take_events()

        async def go() -> None:
            self.state.store.update(self.owner, {**self.base, "status": "in_progress"})
            try:
                result = await self.loop(flush)
                response = self.final(result)
                # NOTE: no HTTP response waits for a background one: its last pass is answered now
                self.ctx.kernel.bus.publish([ResponseSent(request_id=result.request_ids[-1], task_id=self.task_id)])
            except asyncio.CancelledError:
                self.state.store.update(self.owner, self.final(None, "cancelled"))
                raise
            except ApiError as e:
                response = self.final(None, "failed", {"code": e.code or e.error_type, "message": e.message})
            except Exception as e:  # a bug: recorded on the response, logged with its traceback
                log.exception("background response %s failed", rid)
                response = self.final(None, "failed", {"code": "server_error", "message": type(e).__name__})
            self.state.store.update(self.owner, response)

        task = asyncio.get_running_loop().create_task(go())
        self.state.background[rid] = task
        task.add_done_callback(lambda _t: self.state.background.pop(rid, None))
        return web.Response(body=encoder.encode(queued), content_type="application/json")


def usage_of(u: Usage) -> dict[str, Any]:
    return {"input_tokens": u.prompt_tokens, "input_tokens_details": {"cached_tokens": u.cached_tokens},
            "output_tokens": u.completion_tokens, "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
            "total_tokens": u.prompt_tokens + u.completion_tokens}


def _skeleton(body: ResponsesRequest, plan: Plan, model: str) -> dict[str, Any]:
    fmt = body.text.format if body.text is not None and body.text.format is not None else None
    choice = body.tool_choice
    return {
        "id": plan.response_id, "object": "response", "created_at": int(time.time()), "status": "in_progress",
        "background": body.background, "error": None, "incomplete_details": None, "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens, "max_tool_calls": body.max_tool_calls, "model": model,
        "output": [], "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "reasoning": msgspec.to_builtins(body.reasoning) if body.reasoning is not None else {"effort": None,
                                                                                           "summary": None},
        "store": body.store, "temperature": body.temperature, "top_p": body.top_p,
        "text": {"format": msgspec.to_builtins(fmt) if fmt is not None else {"type": "text"}},
        "tool_choice": (choice if isinstance(choice, str) else msgspec.to_builtins(choice)) if choice is not None
        else "auto",
        "tools": msgspec.to_builtins(body.tools or []), "truncation": body.truncation or "disabled",
        "usage": None, "user": body.user, "metadata": body.metadata or {},
    }


# ---- GET / DELETE / cancel / input_items ---------------------------------------------------------

def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=encoder.encode(obj), status=status, content_type="application/json")


async def retrieve(request: web.Request) -> web.Response:
    """Retrieve a stored response (owned by the caller's key)."""
    rid = request.match_info["response_id"]
    if request.query.get("stream") in ("true", "1"):
        raise ApiError(400, "resuming a stream is not supported; GET without stream", param="stream")
    stored = request.app[STATE].store.get(rid, _owner(request.get(EXCHANGE_KEY)))
    if stored is None:
        raise _not_found(rid)
    return _json(stored.response)


async def delete(request: web.Request) -> web.Response:
    """Delete a stored response."""
    rid = request.match_info["response_id"]
    state = request.app[STATE]
    owner = _owner(request.get(EXCHANGE_KEY))
    if state.store.get(rid, owner) is None:
        raise _not_found(rid)
    task = state.background.get(rid)
    if task is not None:
        task.cancel()
    state.store.delete(rid, owner)
    return _json({"id": rid, "object": "response", "deleted": True})


async def cancel(request: web.Request) -> web.Response:
    """Cancel a background response (its model requests are aborted)."""
    rid = request.match_info["response_id"]
    state = request.app[STATE]
    owner = _owner(request.get(EXCHANGE_KEY))
    stored = state.store.get(rid, owner)
    if stored is None:
        raise _not_found(rid)
    if not stored.response.get("background"):
        raise ApiError(400, "only background responses can be cancelled", param="response_id")
    task = state.background.get(rid)
    if task is not None:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
    return _json(state.store.get(rid, owner).response)  # type: ignore[union-attr]


async def input_items(request: web.Request) -> web.Response:
    """List a stored response's input items."""
    rid = request.match_info["response_id"]
    stored = request.app[STATE].store.get(rid, _owner(request.get(EXCHANGE_KEY)))
    if stored is None:
        raise _not_found(rid)
    q = request.query
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ApiError(400, "order must be asc or desc", param="order")
    try:
        limit = int(q.get("limit", "20"))
    except ValueError:
        raise ApiError(400, "limit must be an integer from 1 to 100", param="limit") from None
    if not 1 <= limit <= 100:
        raise ApiError(400, "limit must be an integer from 1 to 100", param="limit")
    items = stored.input if order == "asc" else stored.input[::-1]
    after = q.get("after")
    if after is not None:
        ids = [i["id"] for i in items]
        items = items[ids.index(after) + 1:] if after in ids else []
    page = items[:limit]
    return _json({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                  "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit})
