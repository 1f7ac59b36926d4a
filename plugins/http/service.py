"""What every protocol handler shares: the kernel, model names, admission of n requests, and
per-choice output state (content, reasoning, calls, logprobs, finish) read from kernel events."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from modelcall.core import Kernel, ModelcallError, RequestHandle, SamplingParams
from modelcall.core.metering import EXCHANGE_KEY, Exchange
from modelcall.core.submit import GenerateRequest, choice_params
from modelcall.events import Finished, PositionLogprobs, PromptLogprobs, RequestFailed, TokensEmitted, Usage
from modelcall.events import ToolRequested
from modelcall.plugins.http.errors import ApiError
from modelcall.plugins.http.settings import ServerSettings
from modelcall.plugins.http.tool_calls import ToolCalls

log = logging.getLogger("modelcall.http")


class ServingContext:
    """The kernel as the HTTP handlers see it. The app holds one; each handler gets it `bind`-ed
    to its HTTP request, so `submit` and `count_tokens` hand the kernel that request's Exchange
    (caller, task id, retries, context policy, client address) explicitly."""

    def __init__(self, kernel: Kernel, settings: ServerSettings, exchange: Exchange | None = None,
                 token_text: dict[int, str] | None = None) -> None:
        self.kernel = kernel
        self.settings = settings
        self.exchange = exchange
        self._token_text: dict[int, str] = {} if token_text is None else token_text
        self.lora: str | None = None   # the LoRA adapter the request's `model` named (check_model(..., lora=True))

    def bind(self, request: Any) -> ServingContext:
        """This context for one HTTP request (`request[EXCHANGE_KEY]`, made by the error middleware)."""
        return ServingContext(self.kernel, self.settings, request.get(EXCHANGE_KEY), self._token_text)

    @property
    def model_name(self) -> str:
        return self.kernel.model_name

    @property
    def model_names(self) -> tuple[str, ...]:
        return (self.model_name, *self.settings.served_model_names)

    def check_model(self, model: str | None, lora: bool = False) -> str:
        """The name to answer with; 404 naming the served models when `model` is not one of them. With `lora`
        (the generation routes) `model` may name a LoRA adapter: the request then runs on it (`submit`); whether
        the caller may use it is the entry pipeline's (403)."""
        if model is None or model in self.model_names:
            return model or self.model_name
        loras = self.kernel.loras
        if model is not None and loras is not None and loras.ref(model) is not None:
            if not lora:
                raise ApiError(400, f"{model!r} is a LoRA adapter; this route runs on the base model "
                                    f"{self.model_name!r}", param="model", code="model_not_supported")
            self.lora = model
            return model
        raise ApiError(404, f"the model {model!r} does not exist; this server serves {list(self.model_names)}",
                       error_type="not_found_error", param="model", code="model_not_found")

    def token_text(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self.kernel.tokenizer.decode([token_id], skip_special_tokens=False)
            self._token_text[token_id] = text
        return text

    def token_bytes(self, token_id: int) -> list[int]:
        """The token's own bytes for logprobs (`bytes`): a token may hold part of a character."""
        fn = getattr(self.kernel.tokenizer, "token_bytes", None)
        return list(fn(token_id)) if fn is not None else list(self.token_text(token_id).encode())

    async def submit(self, params: Sequence[SamplingParams], **prompt: Any) -> list[RequestHandle]:
        """Admit the n = len(params) choices of one prompt through the kernel's entry pipeline (the kernel
        prefills the prompt once and forks it, core/submit.py); on any refusal, raise an ApiError.
        `params` is `sampling_params`' list: choice i's differs from the first's only by its seed."""
        if any(p != choice_params(params[0], i) for i, p in enumerate(params)):
            raise ValueError("the choices' sampling params must be sampling_params' (seed + i, nothing else differs)")
        try:
            if self.lora is not None:
                prompt["lora"] = self.lora
            request = GenerateRequest.of(params=params[0], n=len(params), **prompt)
            return await self.kernel.submit_choices(request, exchange=self.exchange)
        except BaseException as e:
            raise as_api_error(e) from e

    async def count_tokens(self, **prompt: Any) -> int:
        """The prompt's token count through the kernel's entry pipeline (counted against the caller's rpm)."""
        try:
            return await self.kernel.count_tokens(exchange=self.exchange, **prompt)
        except BaseException as e:
            raise as_api_error(e) from e

    def splitter(self, handle: RequestHandle) -> None:
        """Kept for older callers: the kernel's output stage splits reasoning now (TokensEmitted.reasoning)."""
        return None


def as_api_error(e: BaseException) -> BaseException:
    """The ApiError to answer for an exception raised while admitting a request (others unchanged)."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, ModelcallError):
        return ApiError.from_kernel(e)
    # Rendering or tokenizing user input (a template's raise_exception, odd unicode) is the
    # input's fault, never a 500.
    names = {c.__name__ for c in type(e).__mro__}
    if isinstance(e, (ValueError, TypeError, UnicodeError, LookupError)) or names & {"TemplateError", "UndefinedError"}:
        log.info("request refused while preparing the prompt: %s: %s", type(e).__name__, e)
        return ApiError(400, f"the prompt could not be prepared: {type(e).__name__}: {e}", param="messages")
    return e


def sampling_params(fields: dict[str, Any], n: int) -> list[SamplingParams]:
    """One SamplingParams per choice; with a seed, choice i gets seed + i so choices differ reproducibly."""
    base = SamplingParams.create(**{k: v for k, v in fields.items() if v is not None or k == "max_tokens"})
    return [choice_params(base, i) for i in range(n)]


def unix_time() -> int:
    return int(time.time())


class Generation:
    """The output of one choice so far, as the kernel's output stage split it: answer and reasoning
    text, logprobs, the complete tool calls (ToolRequested) and how it ended. It renders; it decides
    nothing (no parsing, no counting)."""

    __slots__ = ("index", "handle", "splitter", "content", "reasoning", "logprobs", "finished", "num_tokens",
                 "tool_calls", "prompt_logprobs")

    def __init__(self, index: int, handle: RequestHandle, splitter: Any = None) -> None:
        self.index = index
        self.handle = handle
        self.splitter = splitter
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.logprobs: list[PositionLogprobs] = []
        self.finished: Finished | None = None
        self.num_tokens = 0
        self.tool_calls = ToolCalls()
        self.prompt_logprobs: PromptLogprobs | None = None  # when the request asked for them

    def on_tokens(self, ev: TokensEmitted) -> tuple[str, str]:
        """Account for one delta; returns the (reasoning, answer) text it adds."""
        self.num_tokens += len(ev.token_ids)
        if ev.logprobs:
            self.logprobs.extend(ev.logprobs)
        if ev.reasoning:
            self.reasoning.append(ev.reasoning)
        if ev.text:
            self.content.append(ev.text)
        return ev.reasoning, ev.text

    def on_tool(self, ev: ToolRequested) -> None:
        """One complete call: whole responses list exactly these."""
        self.tool_calls.add(ev)

    def on_finished(self, ev: Finished) -> tuple[str, str]:
        """Record the end (the kernel released everything held before Finished)."""
        self.finished = ev
        return "", ""

    @property
    def text(self) -> str:
        return "".join(self.content)

    @property
    def reasoning_text(self) -> str | None:
        return "".join(self.reasoning) if self.reasoning else None

    @property
    def reasoning_tokens(self) -> int:
        return self.finished.usage.reasoning_tokens if self.finished is not None else 0

    @property
    def usage(self) -> Usage:
        return self.finished.usage if self.finished is not None else Usage()


def check_outcome(ev: object) -> None:
    """Raise for an event that ends a request without an answer (failed, or aborted by the server)."""
    if type(ev) is RequestFailed:
        raise ApiError(500, f"the model failed on this request: {ev.error_type}: {ev.message}",  # type: ignore[attr-defined]
                       error_type="api_error")
    if type(ev) is Finished and ev.reason == "abort":  # type: ignore[attr-defined]
        raise ApiError(503, "the request was aborted by the server (shutting down or overloaded); retry",
                       error_type="overloaded_error", retry_after=1.0)


def total_usage(gens: Sequence[Generation]) -> Usage:
    """Usage of n choices of one prompt: the prompt counted once, outputs summed."""
    first = gens[0].usage
    return Usage(prompt_tokens=first.prompt_tokens, cached_tokens=first.cached_tokens,
                 completion_tokens=sum(g.usage.completion_tokens for g in gens),
                 reasoning_tokens=sum(g.reasoning_tokens for g in gens))


async def read_whole(gens: Sequence[Any]) -> None:
    """Read every choice of a non-streamed answer to its end (each `Generation` keeps its own text,
    usage and finish); a failed request raises through `check_outcome`."""
    async for i, ev in events_of([g.handle for g in gens]):
        if type(ev) is TokensEmitted:
            gens[i].on_tokens(ev)
        elif type(ev) is ToolRequested:
            gens[i].on_tool(ev)
        elif type(ev) is Finished or type(ev) is RequestFailed:
            check_outcome(ev)
            gens[i].on_finished(ev)
        elif type(ev) is PromptLogprobs:
            gens[i].prompt_logprobs = ev


async def events_of(handles: Sequence[RequestHandle]) -> AsyncIterator[tuple[int, Any]]:
    """(choice index, event) of several handles as they come; one handle is read directly."""
    if len(handles) == 1:
        async for ev in handles[0]:
            yield 0, ev
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, h: RequestHandle) -> None:
        try:
            async for ev in h:
                queue.put_nowait((i, ev))
        finally:
            queue.put_nowait((i, None))

    tasks = [asyncio.get_running_loop().create_task(pump(i, h)) for i, h in enumerate(handles)]
    try:
        left = len(tasks)
        while left:
            i, ev = await queue.get()
            if ev is None:
                left -= 1
            else:
                yield i, ev
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t


def close_all(handles: Sequence[RequestHandle]) -> None:
    for h in handles:
        h.close()
