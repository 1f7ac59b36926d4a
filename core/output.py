"""The output stage: one pipeline, in core, for every request's output, advanced once per token.

    token -> detokenize -> stop strings -> reasoning split -> tool-call markup -> safety filters -> Released

Each stage reads only what the one before released, so every front end renders the same split
and the same counts:

* detokenize: a view that keeps the special tokens the request's parsers read as markup
  (`<think>`, `<tool_call>` made special by a tokenizer); they never reach clients as content.
* stop strings: text that might still turn into a stop string is held back (only as much as the
  longest stop string needs); held text is released in order on every ending.
* reasoning split (chat requests whose model has a reasoning parser): reasoning apart from
  content, reasoning tokens counted by token; a tool call written inside reasoning stays reasoning.
* tool-call markup (requests that offered tools): markup becomes call deltas, complete calls.
* safety filters: content, reasoning, tool arguments and logprobs each pass the request's filters.

Stages a request does not need are None and cost nothing per token.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from modelcall.core.reasoning import ReasoningParser, ReasoningSupport
from modelcall.core.request import Request
from modelcall.core.safety import OutputFilters, output_filters
from modelcall.core.stages import IncrementalDetokenizer
from modelcall.core.tools import ToolCall, ToolCallStream
from modelcall.events.tools import ToolCallDelta
from modelcall.events.types import PositionLogprobs


class Released:
    """What one token (or the end) released, split by where it goes; `reason` set when it ended."""

    __slots__ = ("text", "reasoning", "tool_calls", "calls", "reasoning_tokens", "logprobs", "reason", "stop_reason")

    def __init__(self, text: str, reasoning: str, tool_calls: tuple[ToolCallDelta, ...] | None,
                 calls: tuple[ToolCall, ...], reasoning_tokens: int, logprobs: tuple[PositionLogprobs, ...] | None,
                 reason: str | None, stop_reason: str | int | None) -> None:
        self.text = text
        self.reasoning = reasoning
        self.tool_calls = tool_calls
        self.calls = calls
        self.reasoning_tokens = reasoning_tokens
        self.logprobs = logprobs
        self.reason = reason
        self.stop_reason = stop_reason

    @property
    def empty(self) -> bool:
        return not (self.text or self.reasoning or self.tool_calls or self.logprobs)


class StopStrings:
    """Finds the first stop string to complete, holding back text that might still become one."""

    __slots__ = ("stops", "include_stop", "held")

    def __init__(self, stops: tuple[str, ...], include_stop: bool) -> None:
        self.stops = stops
        self.include_stop = include_stop
        self.held = ""  # decided-not-yet text that could still start a stop string

    def push(self, text: str, final: bool, allowed: bool = True) -> tuple[str, str | None]:
        """(text to release, the stop string that matched or None). `allowed`: min_tokens reached."""
        buf = self.held + text
        if allowed:
            end, which = first_stop(buf, self.stops)
            if which is not None:
                self.held = ""
                return buf[:end if self.include_stop else end - len(which)], which
        if final:
            self.held = ""
            return buf, None
        keep = stop_prefix_len(buf, self.stops)
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep], None


def first_stop(text: str, stops: Sequence[str]) -> tuple[int, str | None]:
    """(end index, stop) of the stop string that completes first in `text` (the earliest end;
    of two ending together, the longer), so the answer never depends on how text was chunked."""
    best, which = len(text) + 1, None
    for s in stops:
        i = text.find(s)
        if i != -1:
            end = i + len(s)
            if end < best or (end == best and which is not None and len(s) > len(which)):
                best, which = end, s
    return best, which


def stop_prefix_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
    longest = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:k]):
                longest = k
                break
    return longest


class MarkupDetokenizer:
    """The parser's view of a detokenizer that skips special tokens: the special tokens named in
    `markup` (token id -> its text) are kept, in place, so parsers can read them."""

    __slots__ = ("inner", "markup")

    def __init__(self, inner: IncrementalDetokenizer, markup: dict[int, str]) -> None:
        self.inner = inner
        self.markup = markup

    def push(self, token_ids: Sequence[int]) -> str:
        out: list[str] = []
        for t in token_ids:
            tag = self.markup.get(t)
            if tag is None:
                out.append(self.inner.push((t,)))
            else:  # NOTE: bytes of an unfinished character before a tag are given up first, in order
                out.append(self.inner.push((t,)) + self.inner.flush() + tag)
        return "".join(out)

    def flush(self) -> str:
        return self.inner.flush()


class OutputState:
    """Per-request output pipeline, advanced once per sampled token (see the module docstring)."""

    __slots__ = ("detok", "stops", "reasoning", "tools", "filters", "strip_tags", "pieces", "reasoning_pieces",
                 "reasoning_tokens", "num_calls", "ended", "plain")

    def __init__(self, detok: IncrementalDetokenizer, stops: tuple[str, ...] = (), include_stop: bool = False, *,
                 reasoning: ReasoningParser | None = None, tools: ToolCallStream | None = None,
                 filters: OutputFilters | None = None, strip_tags: tuple[str, ...] = ()) -> None:
        self.detok = detok
        self.stops = StopStrings(stops, include_stop) if stops else None
        self.reasoning = reasoning
        self.tools = tools
        self.filters = filters
        self.strip_tags = strip_tags  # special-token markup kept for the parsers; never released as text
        self.pieces: list[str] = []            # content released so far (joined once, at the end)
        self.reasoning_pieces: list[str] = []  # reasoning released so far
        self.reasoning_tokens = 0
        self.num_calls = 0
        self.ended = False
        self.plain = self.stops is None and reasoning is None and tools is None and filters is None

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def reasoning_text(self) -> str:
        return "".join(self.reasoning_pieces)

    def on_token(self, request: Request, token_id: int, window: int,
                 logprob: PositionLogprobs | None = None) -> Released:
        """Account for one newly appended token; return what it released (and whether it ended)."""
        p = request.params
        n_out = request.num_output_tokens
        r_tok = 1 if self.reasoning is not None and self.reasoning.is_reasoning(token_id) else 0
        if n_out > p.min_tokens and ((not p.ignore_eos and token_id in request.eos_token_ids)
                                     or token_id in p.stop_token_ids):
            return self._advance("", True, "stop", token_id, r_tok, logprob)
        piece = self.detok.push((token_id,))
        if n_out >= request.max_tokens or request.num_tokens >= window:
            return self._advance(piece, True, "length", None, r_tok, logprob, n_out >= p.min_tokens)
        if self.plain:  # NOTE: most requests: no stop strings, parsers or filters; nothing to hold back
            if piece:
                self.pieces.append(piece)
            return Released(piece, "", None, (), 0, (logprob,) if logprob is not None else None, None, None)
        return self._advance(piece, False, None, None, r_tok, logprob, n_out >= p.min_tokens)

    def close(self, reason: str = "abort") -> Released:
        """The request ended from outside (abort, error): release everything held, in order."""
        if self.ended:
            return Released("", "", None, (), 0, None, reason, None)
        return self._advance("", True, reason, None, 0, None)

    def _advance(self, piece: str, final: bool, reason: str | None, stop_reason: Any, r_tok: int,
                 logprob: PositionLogprobs | None, stop_allowed: bool = True) -> Released:
        if final:
            piece += self.detok.flush()
        raw = piece
        if self.stops is not None:
            piece, which = self.stops.push(piece, final, stop_allowed)
            if which is not None:
                final, reason, stop_reason = True, "stop", which
        reasoning = ""
        if self.reasoning is not None:
            reasoning, piece = self.reasoning.feed(piece) if piece else ("", "")
            if final:
                r, c = self.reasoning.finish()
                reasoning, piece = reasoning + r, piece + c
        deltas: tuple[ToolCallDelta, ...] | None = None
        calls: tuple[ToolCall, ...] = ()
        if self.tools is not None:
            d = self.tools.feed(piece, final)
            piece, deltas, calls = d.content, d.deltas or None, d.completed
        if self.strip_tags:
            piece, reasoning = _strip(piece, self.strip_tags), _strip(reasoning, self.strip_tags)
        logprobs = (logprob,) if logprob is not None else None
        f = self.filters
        if f is not None:
            piece, reasoning = f.text(piece, reasoning, final)
            if f.blocked is None and (deltas or calls or final):
                deltas, calls = f.calls(deltas, calls, final)
            logprobs = f.gate.push(raw, logprob, final or f.blocked is not None) or None
            if f.blocked is not None:
                logprobs, calls = None, ()
                final, reason, stop_reason = True, "content_filter", f.blocked
        if piece:
            self.pieces.append(piece)
        if reasoning:
            self.reasoning_pieces.append(reasoning)
        self.reasoning_tokens += r_tok
        self.num_calls += len(calls)
        if final:
            self.ended = True
            if reason == "stop" and self.num_calls:
                reason = "tool_calls"
        return Released(piece, reasoning, deltas, calls, r_tok, logprobs, reason, stop_reason)


def _strip(text: str, tags: tuple[str, ...]) -> str:
    for tag in tags:
        if tag in text:
            text = text.replace(tag, "")
    return text


class OutputStage:
    """Builds each request's OutputState from what the kernel assembled at start-up: the tokenizer,
    the reasoning parsers and the output filters."""

    def __init__(self, tokenizer: Any, reasoning: ReasoningSupport | None, filters: list[tuple[str, Any]]) -> None:
        self.tokenizer = tokenizer
        self.reasoning = reasoning
        self.filters = filters
        self.special_ids: frozenset[int] = frozenset(getattr(tokenizer, "special_token_ids", ()) or ())
        self._markup: dict[str, tuple[int, str] | None] = {}
        self._token_text: dict[int, str] = {}

    @classmethod
    def assemble(cls, host: Any, config: Any, tokenizer: Any, filters: list[tuple[str, Any]]) -> OutputStage:
        return cls(tokenizer, ReasoningSupport.assemble(host, config, tokenizer), filters)

    def open(self, request: Request, *, tool_stream: ToolCallStream | None = None, chat: bool = False,
             chat_template_kwargs: dict | None = None) -> OutputState:
        """The output state of one admitted request. `chat`: the prompt came as messages (only chat
        responses are split into reasoning and content; a plain prompt's output stays raw text)."""
        p = request.params
        reasoning = self.reasoning.open(request.prompt_token_ids, chat_template_kwargs) \
            if chat and self.reasoning is not None else None
        detok: IncrementalDetokenizer = self.tokenizer.detokenizer(request.prompt_token_ids,
                                                                   skip_special_tokens=p.skip_special_tokens)
        tags = (*(reasoning.tags if reasoning is not None else ()), *(tool_stream.tags if tool_stream else ()))
        strip: tuple[str, ...] = ()
        if tags and p.skip_special_tokens and self.special_ids:
            markup = dict(m for m in map(self._special, tags) if m is not None)
            if markup:
                detok = MarkupDetokenizer(detok, markup)
                strip = tuple(markup.values())
        filters = output_filters(self.filters, request, self.token_text) if self.filters else None
        return OutputState(detok, p.stop, p.include_stop_str_in_output, reasoning=reasoning, tools=tool_stream,
                           filters=filters, strip_tags=strip)

    def token_text(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    def _special(self, tag: str) -> tuple[int, str] | None:
        """(id, text) when `tag` is one special token of the tokenizer (skipped by its detokenizer)."""
        if tag not in self._markup:
            to_id: Callable[[str], int | None] | None = getattr(self.tokenizer, "token_to_id", None)
            i = to_id(tag) if to_id is not None else None
            if i is None:
                ids = self.tokenizer.encode(tag)
                i = ids[0] if len(ids) == 1 else None
            self._markup[tag] = (i, tag) if i is not None and i in self.special_ids else None
        return self._markup[tag]
