"""Model clients for the agent: any OpenAI-compatible URL over HTTP, or a Kernel in process.
Both answer one chat turn as a ModelReply; the HTTP one retries 429/503/connection errors with
backoff and records each retry."""
from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any, Protocol

import msgspec

from modelcall.plugins.agent.result import Retry

TASK_HEADER = "x-modelcall-task-id"
RETRIES_HEADER = "x-modelcall-retries"


def traceparent(trace_ids: dict[str, str], task_id: str) -> str:
    """A W3C `traceparent` for one model request: under the app's current OpenTelemetry span when
    it has one, else in one trace per task (a new span id per request), so the server's spans of
    a task's requests land in one trace."""
    try:
        from opentelemetry import trace
    except ImportError:
        pass
    else:
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
    trace_id = trace_ids.setdefault(task_id, f"{random.getrandbits(128) or 1:032x}")
    return f"00-{trace_id}-{random.getrandbits(64) or 1:016x}-01"


def parse_server_timing(header: str | None) -> dict[str, float]:
    """{"queue_s": ..., "prefill_s": ..., "decode_s": ..., "e2e_s": ...} from `Server-Timing` (ms)."""
    out: dict[str, float] = {}
    for part in (header or "").split(","):
        name, _, rest = part.strip().partition(";")
        for param in rest.split(";"):
            key, _, value = param.strip().partition("=")
            if key == "dur" and name:
                try:
                    out[f"{name}_s"] = float(value) / 1e3
                except ValueError:
                    pass
    return out


def _usage(u: dict[str, Any]) -> dict[str, int]:
    """OpenAI usage as flat counts: prompt, completion, total, and cached / reasoning when told."""
    out = {k: v for k, v in u.items() if isinstance(v, int)}
    for details, key in (("prompt_tokens_details", "cached_tokens"), ("completion_tokens_details", "reasoning_tokens")):
        value = (u.get(details) or {}).get(key)
        if isinstance(value, int):
            out[key] = value
    return out


class ModelReply(msgspec.Struct, kw_only=True):
    request_id: str | None
    content: str
    tool_calls: list[dict[str, str]]   # {"id", "name", "arguments"}
    finish_reason: str | None
    usage: dict[str, int]
    timings: dict[str, Any] = {}
    retries: list[Retry] = []


class ModelError(Exception):
    """A model request failed for good (after its retries, or an error not worth retrying)."""

    def __init__(self, message: str, retries: list[Retry]) -> None:
        super().__init__(message)
        self.retries = retries


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    attempts: int = 4
    base_delay_s: float = 0.2
    max_delay_s: float = 5.0
    retry_status: tuple[int, ...] = (429, 502, 503, 504)

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.max_delay_s)
        return min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)


class ChatClient(Protocol):
    async def chat(self, messages: list[dict], *, tools: list[dict], tool_choice: Any, task_id: str,
                   params: dict[str, Any]) -> ModelReply:
        ...


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class OpenAIChatClient:
    """POST {base_url}/v1/chat/completions (non-streaming), the task id in `x-modelcall-task-id`."""

    def __init__(self, base_url: str, *, model: str | None = None, api_key: str | None = None,
                 retry: RetryPolicy | None = None, timeout_s: float = 120.0) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.model = model
        self.api_key = api_key
        self.retry = retry or RetryPolicy()
        self.timeout_s = timeout_s
        self._session: Any = None
        self._trace_ids: dict[str, str] = {}  # task id -> W3C trace id of its requests

    async def _http(self) -> Any:
        import aiohttp
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def chat(self, messages: list[dict], *, tools: list[dict], tool_choice: Any, task_id: str,
                   params: dict[str, Any]) -> ModelReply:
        body = {"messages": messages, **params}
        if self.model:
            body["model"] = self.model
        if tools:
            body["tools"] = tools
            body["tool_choice"] = tool_choice
        headers = {TASK_HEADER: task_id, "traceparent": traceparent(self._trace_ids, task_id)}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        retries: list[Retry] = []
        for attempt in range(1, self.retry.attempts + 1):
            if attempt > 1:  # the server records how many earlier attempts this request had
                headers[RETRIES_HEADER] = str(attempt - 1)
            try:
                reply = await self._once(body, headers)
                reply.retries = retries
                return reply
            except _Retryable as e:
                if attempt == self.retry.attempts:
                    raise ModelError(f"gave up after {attempt} attempts: {e}", retries) from None
                delay = self.retry.delay(attempt, e.retry_after)
                retries.append(Retry(attempt, str(e), delay))
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def _once(self, body: dict, headers: dict) -> ModelReply:
        import aiohttp
        session = await self._http()
        try:
            async with session.post(self.base_url + "/v1/chat/completions", json=body, headers=headers) as resp:
                text = await resp.text()
                timing = resp.headers.get("Server-Timing")
                if resp.status in self.retry.retry_status:
                    after = resp.headers.get("Retry-After")
                    raise _Retryable(f"HTTP {resp.status}: {text[:200]}", float(after) if after else None)
                if resp.status != 200:
                    raise ModelError(f"HTTP {resp.status}: {text[:500]}", [])
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as e:
            raise _Retryable(f"{type(e).__name__}: {e}") from None
        data = json.loads(text)
        choice = data["choices"][0]
        msg = choice["message"]
        calls = [{"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                 for c in msg.get("tool_calls") or ()]
        return ModelReply(request_id=data.get("id"), content=msg.get("content") or "", tool_calls=calls,
                          finish_reason=choice.get("finish_reason"), usage=_usage(data.get("usage") or {}),
                          timings=parse_server_timing(timing))


class KernelChatClient:
    """One chat turn on an in-process Kernel; the task id goes to `Kernel.submit(task_id=...)`."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel

    async def close(self) -> None:
        pass

    def publish(self, event: Any) -> None:
        """The runtime's ToolExecuted/ToolFailed go on the kernel's bus, beside its ToolRequested."""
        self.kernel.bus.publish((event,))

    async def chat(self, messages: list[dict], *, tools: list[dict], tool_choice: Any, task_id: str,
                   params: dict[str, Any]) -> ModelReply:
        from modelcall.core import ModelcallError
        from modelcall.events import Finished, RequestFailed, TokensEmitted

        p = dict(params)
        parallel = p.pop("parallel_tool_calls", None)
        try:
            handle = await self.kernel.submit(messages=messages, tools=tools or None, tool_choice=tool_choice,
                                              parallel_tool_calls=parallel, task_id=task_id, **p)
        except ModelcallError as e:
            raise ModelError(f"{type(e).__name__}: {e}", []) from None
        text, calls = [], []
        async with handle:
            async for ev in handle:
                if type(ev) is TokensEmitted:
                    text.append(ev.text)
                    for d in ev.tool_calls or ():
                        if d.name is not None:
                            calls.append({"id": d.id or "", "name": d.name, "arguments": ""})
                        calls[d.index]["arguments"] += d.arguments
                elif type(ev) is Finished:
                    t = ev.timings
                    usage = {"prompt_tokens": ev.usage.prompt_tokens, "completion_tokens": ev.usage.completion_tokens,
                             "total_tokens": ev.usage.total_tokens}
                    timings = {"queue_s": t.queue_s, "prefill_s": t.prefill_s, "decode_s": t.decode_s,
                               "e2e_s": t.e2e_s}
                    return ModelReply(request_id=handle.request_id, content="".join(text), tool_calls=calls,
                                      finish_reason=ev.reason, usage=usage, timings=timings)
                elif type(ev) is RequestFailed:
                    raise ModelError(f"{ev.error_type}: {ev.message}", [])
        raise ModelError("the request ended without an answer", [])


def now() -> float:
    return time.monotonic()
