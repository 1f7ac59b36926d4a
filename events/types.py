"""The typed events of one model call: frozen msgspec Structs, one per stage transition.

Every event carries the request it belongs to, the task it is part of (when the caller
named one) and a monotonic timestamp taken where the event happened, so a log line, an SSE
frame and a test assertion all see the same object.
"""
from __future__ import annotations

import time

import msgspec

from modelcall.events.tools import ToolCallDelta

now = time.monotonic  # NOTE: every timestamp in modelcall is on this clock; wall time only at the edges


class Usage(msgspec.Struct, frozen=True, gc=False):
    """Token usage of one model request, each category by its own definition.

    `cached_tokens` is the part of `prompt_tokens` read from the prefix cache (not computed);
    `reasoning_tokens` is the part of `completion_tokens` spent inside reasoning blocks.
    `cached_disk_tokens` is the part of `cached_tokens` read back from the disk KV tier (docs/kv-cache.md).
    None is added on top of the total it belongs to.
    """

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cached_disk_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Timings(msgspec.Struct, frozen=True, gc=False):
    """Monotonic timestamps of one request, each taken where the stage happened (None: never reached)."""

    received: float
    admitted: float | None = None
    scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None

    @property
    def queue_s(self) -> float | None:
        return _span(self.admitted, self.scheduled)

    @property
    def prefill_s(self) -> float | None:
        return _span(self.scheduled, self.first_token)

    @property
    def decode_s(self) -> float | None:
        return _span(self.first_token, self.last_token)

    @property
    def ttft_s(self) -> float | None:
        return _span(self.received, self.first_token)

    @property
    def e2e_s(self) -> float | None:
        return _span(self.received, self.finished)


def _span(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


class TokenLogprob(msgspec.Struct, frozen=True, gc=False, array_like=True):
    token_id: int
    logprob: float


class PositionLogprobs(msgspec.Struct, frozen=True, gc=False):
    """Log-probability of the sampled token at one position and the top-N alternatives."""

    token_id: int
    logprob: float
    top: tuple[TokenLogprob, ...] = ()


class Event(msgspec.Struct, frozen=True, gc=False, tag=True, kw_only=True):
    """Base of every event. Subclasses are tagged by class name in JSON and msgpack."""

    request_id: str
    task_id: str | None = None
    ts: float = msgspec.field(default_factory=now)


class RequestAdmitted(Event):
    """The entry stage accepted the request: tokenized, validated, within the context window."""

    model: str
    prompt_tokens: int
    max_tokens: int
    priority: int = 0
    caller: str | None = None                   # the authenticated caller's name (never a key)
    prompt_parts: dict[str, int] | None = None  # prompt tokens by part (see modelcall.core.context)
    dropped_messages: int = 0                   # history messages a context policy dropped to fit
    retries: int = 0                            # earlier attempts of this request, as the caller told
    tool_results: tuple[str, ...] = ()          # ids of earlier tool calls whose results this prompt carries
    kind: str = "generate"                      # "generate", or a pooling request's "embed" / "score" (core/pooling.py)
    lora: str | None = None                     # the LoRA adapter it runs on, by its served name; None: the base model


class RequestQueued(Event):
    """The request waits for the scheduler (new, or again after preemption)."""

    num_waiting: int


class RequestScheduled(Event):
    """The request got its first share of a step; `cached_tokens` came from the prefix cache."""

    cached_tokens: int


class PrefillDone(Event):
    """The whole prompt is computed and the first token sampled."""

    first_token_id: int


class PromptLogprobs(Event):
    """Every prompt token's log-probability given the tokens before it (the first has none), sent once
    when the whole prompt is computed, before any token is emitted. `ranks[i]` is the rank of token i
    in its distribution (1: most likely; 0 for the first token)."""

    logprobs: tuple[PositionLogprobs | None, ...]
    ranks: tuple[int, ...] = ()


class Pooled(Event):
    """A pooling request's vector (embeddings): its prompt computed, its hidden states pooled by the
    model's pooler (core/pooling.py); `Finished` follows with the prompt tokens as usage."""

    embedding: tuple[float, ...]
    num_prompt_tokens: int = 0


class TokensEmitted(Event):
    """What one request's output stage released in one engine step, split by where it goes.

    The output stage (core/output.py) runs, in this order: detokenize -> stop strings -> reasoning
    split -> tool-call markup -> safety filters. Each field is what left that pipeline this step:

    - `text`: the answer (content) delta. Never holds reasoning, tool-call markup or special tokens.
    - `reasoning`: the reasoning delta (inside the model's thinking block; tags removed).
    - `tool_calls`: tool-call fragments (only for requests that offered tools): a call's first
      fragment carries its id and whole name, later ones argument text. A call is final only once
      its `ToolRequested` follows; a call cut by the end of the output never gets one.
    - `reasoning_tokens`: how many of `token_ids` are reasoning tokens (tags included), counted
      by token in core. Over a request, they sum to `Finished.usage.reasoning_tokens`.
    - `logprobs`: the positions released by this step, in order (each names its `token_id`).
      Without output filters, one per token of `token_ids`; with filters, a position waits until
      its token's text has passed them and is withheld when that text was redacted or blocked.

    Text may lag the tokens: bytes of an unfinished character, text that might still become a
    stop string, a partial tag and text a filter still examines are held back until decided,
    and released in order on every ending.
    """

    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[PositionLogprobs, ...] | None = None
    tool_calls: tuple[ToolCallDelta, ...] | None = None
    reasoning: str = ""
    reasoning_tokens: int = 0


class Preempted(Event):
    """The request lost its KV blocks to make room; it will recompute, nothing is lost."""

    recompute_tokens: int  # known tokens whose K/V must be computed again


class ToolRequested(Event):
    """The model proposed one complete, parsed tool call (published right after the TokensEmitted
    that completed it, before Finished). Whole responses list exactly these calls: `arguments` is
    the JSON object text the call's fragments joined to (after the output filters)."""

    call_id: str
    name: str
    arguments: str


class ToolExecuted(Event):
    """An app-side runtime executed a tool call and has its result."""

    call_id: str
    name: str
    duration_s: float
    result_preview: str = ""


class ToolFailed(Event):
    """A tool call was refused or failed; the failure is fed back to the model as a message."""

    call_id: str
    name: str
    error: str
    duration_s: float = 0.0


class Finished(Event):
    """The request ended. `reason`: stop, length, abort, tool_calls, content_filter, error.

    `tool_calls` only when the output stopped by itself after at least one complete call; a
    call cut by max_tokens leaves `length`."""

    reason: str
    usage: Usage
    timings: Timings
    text: str = ""                        # the whole answer: every TokensEmitted.text joined
    stop_reason: str | int | None = None  # the stop string or token id that matched
    reasoning: str = ""                   # the whole reasoning: every TokensEmitted.reasoning joined
    # Speculative decoding (off: both 0): draft tokens verified for this request, and how many were accepted.
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0


class ResponseSent(Event):
    """The front end wrote the last byte of the request's response (after Finished).

    `usage` is the usage the response reported when the front end refined it (e.g. reasoning
    tokens counted while splitting the output)."""

    status: int = 200
    usage: Usage | None = None


class RequestRejected(Event):
    """The entry stage refused the request before any compute (bad input, over budget, full)."""

    status: int
    error_type: str
    message: str
    caller: str | None = None  # the authenticated caller's name, when one was known
    step: str | None = None    # the entry step that refused (auth, caller, validate, permissions, quota, ...)
    client: str | None = None  # the client's address, when a front end knew it (the ledger throttles 401s by it)


class RequestFailed(Event):
    """The request failed after admission; its resources are freed."""

    error_type: str
    message: str


class StepDone(msgspec.Struct, frozen=True, gc=False, tag=True, kw_only=True):
    """One engine step: how many tokens of how many requests, and where its time went."""

    step: int
    num_tokens: int
    num_requests: int
    num_waiting: int
    num_running: int
    kv_usage: float
    schedule_s: float
    forward_s: float
    step_s: float
    ts: float = msgspec.field(default_factory=now)
    num_steps: int = 1   # a decode burst's steps (core/burst.py): num_tokens counts every step's


REQUEST_EVENTS = (
    RequestAdmitted, RequestQueued, RequestScheduled, PrefillDone, PromptLogprobs, Pooled, TokensEmitted, Preempted,
    ToolRequested, ToolExecuted, ToolFailed, Finished, RequestRejected, RequestFailed, ResponseSent,
)
TERMINAL_EVENTS = (Finished, RequestRejected, RequestFailed)
AnyEvent = (
    RequestAdmitted | RequestQueued | RequestScheduled | PrefillDone | PromptLogprobs | Pooled | TokensEmitted | Preempted
    | ToolRequested | ToolExecuted | ToolFailed | Finished | RequestRejected | RequestFailed | StepDone
    | ResponseSent
)
