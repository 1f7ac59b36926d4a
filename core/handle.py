"""The caller's side of one admitted request: iterate its events, or abort it."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from modelcall.events.stream import RequestStream
from modelcall.events.types import Event, Finished, Pooled, RequestFailed, TokensEmitted, ToolRequested


class RequestHandle:
    """Async iterator over one request's events; leaving early (break, close, garbage) aborts it."""

    def __init__(self, request_id: str, task_id: str | None, stream: RequestStream,
                 abort: Callable[[str], None], prompt_token_ids: list[int]) -> None:
        self.request_id = request_id
        self.task_id = task_id
        self.prompt_token_ids = prompt_token_ids
        self._stream = stream
        self._abort = abort
        self.context: dict | None = None       # what a context policy dropped to fit the window, if anything
        self.prompt_parts: dict | None = None  # prompt tokens by part (chat prompts)

    def __aiter__(self) -> RequestHandle:
        return self

    async def __anext__(self) -> Event:
        return await self._stream.__anext__()

    async def __aenter__(self) -> RequestHandle:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop reading; an unfinished request is aborted and its KV blocks freed."""
        if not self._stream.finished and not self._stream.consumer_gone:
            self._stream.close()
            self._abort(self.request_id)

    def abort(self) -> None:
        """Ask the kernel to end this request; the stream still ends with its `Finished(abort)`."""
        self._abort(self.request_id)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    async def result(self) -> Completion:
        """Read the request to its end and return the whole completion."""
        text, tokens, logprobs, calls = [], [], [], []
        embedding = None
        async for ev in self:
            if type(ev) is TokensEmitted:
                text.append(ev.text)
                tokens.extend(ev.token_ids)
                if ev.logprobs:
                    logprobs.extend(ev.logprobs)
            elif type(ev) is ToolRequested:
                calls.append(ev)
            elif type(ev) is Pooled:
                embedding = list(ev.embedding)
            elif type(ev) is Finished:
                done = Completion(self.request_id, "".join(text), tokens, ev, logprobs or None)
                done.tool_calls = calls
                done.embedding = embedding
                return done
            elif type(ev) is RequestFailed:
                raise RuntimeError(f"request {self.request_id} failed: {ev.error_type}: {ev.message}")
        raise RuntimeError(f"request {self.request_id} ended without a Finished event")


class Completion:
    """A finished request: its text (the answer), token ids and the Finished event (reason, usage,
    timings); `reasoning` and `tool_calls` (its complete calls, ToolRequested) as the output stage split them."""

    def __init__(self, request_id: str, text: str, token_ids: list[int], finished: Finished,
                 logprobs: list | None) -> None:
        self.request_id = request_id
        self.text = text
        self.token_ids = token_ids
        self.finished = finished
        self.logprobs = logprobs
        self.tool_calls: list[ToolRequested] = []
        self.embedding: list[float] | None = None   # a pooling request's vector (its Pooled event)

    @property
    def reasoning(self) -> str:
        return self.finished.reasoning

    @property
    def finish_reason(self) -> str:
        return self.finished.reason

    @property
    def usage(self):  # noqa: ANN201 - modelcall.events.Usage
        return self.finished.usage

    def __repr__(self) -> str:
        return f"Completion({self.request_id!r}, {self.finish_reason}, {self.text!r})"
