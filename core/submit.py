"""How a request is submitted: the typed request (`GenerateRequest`), where one submit stands among the
n choices of its call (`Choice`), and the submit surface a Kernel and a RemoteKernel share (`Submitting`).

    handle = await kernel.submit(GenerateRequest(prompt="Hello", params=SamplingParams(max_tokens=16)))
    handle = await kernel.submit("Hello", max_tokens=16)             # the same, keyword form
    handles = await kernel.submit_choices("Hello", n=4, seed=7, temperature=1.0, max_tokens=16)

n > 1 is done here, once, for every caller (in-process, HTTP, a replicated front end): the first choice
is admitted holding `n - 1` forks, the others share its prompt token ids, so the prompt is prefilled
once, its K/V forked to them, and it is charged once.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec

from modelcall.core.errors import InvalidRequest
from modelcall.core.handle import Completion, RequestHandle
from modelcall.core.metering import Caller, Exchange
from modelcall.core.params import SamplingParams
from modelcall.core.pooling import PoolingParams
from modelcall.events import Event


class GenerateRequest(msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """One call's request to the model, as `Kernel.submit` takes it (OpenAI meanings where it has them)."""

    prompt: str | None = None
    """Text prompt. Exactly one of `prompt`, `messages`, `prompt_token_ids`."""
    messages: list[dict] | None = None
    """Chat messages, rendered with the model's chat template (with `tools`, if given)."""
    prompt_token_ids: list[int] | None = None
    """The prompt as token ids, used as they are (no template, no tokenizer)."""
    tools: list[dict] | None = None
    """Function tools the model may call (OpenAI `tools`); calls come as `ToolRequested` events."""
    chat_template_kwargs: dict | None = None
    """Extra variables for the chat template (e.g. `enable_thinking`)."""
    params: SamplingParams | None = None
    """How to sample and when to stop. Give this or `param_fields`, not both."""
    param_fields: dict[str, Any] = {}
    """Loose sampling fields (as JSON gives them: `max_tokens`, `temperature`, ...), validated by the
    entry pipeline's validate step, so a bad one is refused and published like any other refusal."""
    n: int = 1
    """How many choices (`Kernel.submit_choices`): the prompt is prefilled once and forked n ways;
    with a seed, choice i samples with seed + i, so the choices differ and are reproducible."""
    request_id: str | None = None
    """The request's id (None: a fresh one). With n > 1 the first choice's; choice i gets `<id>-<i>`."""
    task_id: str | None = None
    """The task (agent run) this request belongs to, for records and per-task usage."""
    priority: int | None = None
    """Scheduling priority asked for (lower runs first); the caller's key may floor it."""
    cache_salt: str | None = None
    """Prefix-cache scope asked for: no prefix is shared with requests of another salt."""
    tool_choice: Any = None
    """"none", "auto", "required" or a named function (OpenAI `tool_choice`)."""
    response_format: Any = None
    """Structured output: json_object or json_schema (OpenAI `response_format`)."""
    parallel_tool_calls: bool | None = None
    """Whether the model may call several tools in one turn (None: the parser's default)."""
    tool_parser: str | None = None
    """The tool-call parser by name (None: the model's own)."""
    logits_processors: tuple[Any, ...] = ()
    """The caller's own logits processors (see `Request.logits_processors`); in-process only, applied
    to every choice."""
    caller: Caller | None = None
    """The authenticated caller: its key's allowlist, priority floor and cache scope apply, and the
    meters charge it (None: the exchange's caller, or nobody)."""
    context_policy: str | None = None
    """"drop_oldest" lets a chat prompt over the window drop its oldest history (None: refuse it)."""
    retries: int = 0
    """How many times the client says it retried this call (recorded)."""
    lora: str | None = None
    """The LoRA adapter to run on, by its served name (`Kernel.loras`); None: the base model. Its key decides
    which adapters the caller may use (403 otherwise); an unknown name is a 404."""
    pooling: PoolingParams | None = None
    """A pooling request (embeddings): no tokens are generated; the prompt is prefilled like any other
    and the request finishes at its end with a `Pooled` event (its vector). A text prompt is encoded
    with the tokenizer's special tokens (as sentence-transformers does). n must be 1."""

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise InvalidRequest(f"n must be at least 1, got {self.n!r}", field="n")
        if self.pooling is not None and self.n != 1:
            raise InvalidRequest(f"a pooling request has one result; n={self.n}", field="n")

    @classmethod
    def of(cls, **fields: Any) -> GenerateRequest:
        """The keyword form: the request's own fields by name, every other keyword a sampling field."""
        own = {k: fields.pop(k) for k in list(fields) if k in cls.__struct_fields__}
        if fields:
            own["param_fields"] = {**own.get("param_fields", {}), **fields}
        return cls(**own)

    def choice(self, i: int, first: RequestHandle) -> GenerateRequest:
        """Choice i > 0 of this request: the first choice's prompt token ids, seed + i, no prompt
        logprobs (the first choice scores the shared prompt), the per-choice terms kept."""
        params, loose = self.params, self.param_fields
        if params is not None:
            params = msgspec.structs.replace(choice_params(params, i), prompt_logprobs=None)
        else:
            loose = {k: v for k, v in loose.items() if k != "prompt_logprobs"}
            if isinstance(loose.get("seed"), int):
                loose["seed"] = (loose["seed"] + i) % 2**63
        rid = f"{self.request_id}-{i}" if self.request_id is not None else None
        return msgspec.structs.replace(self, prompt=None, messages=None, prompt_token_ids=list(first.prompt_token_ids),
                                       params=params, param_fields=loose, n=1, request_id=rid)


def choice_params(params: SamplingParams, i: int) -> SamplingParams:
    """Choice i's sampling params: with a seed, seed + i, so the n choices differ reproducibly."""
    if params.seed is None or i == 0:
        return params
    return msgspec.structs.replace(params, seed=(params.seed + i) % 2**63)


class Choice(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """Where one submitted request stands among the n choices of its call (n = 1: the defaults)."""

    fork_of: str | None = None
    """Choices after the first: the first's request id, whose prompt (same ids) this one shares and
    is charged to (its usage and quota count 0 prompt tokens)."""
    forks: int = 0
    """The first choice: how many forks follow. It is held until they are admitted (aborted if one is
    refused), its prompt prefilled once and its K/V forked to them."""
    sequences: int = 1
    """Sequences this submit adds to its client call's cap (the first choice counts all n, before any runs)."""
    chat: bool = False
    """Choices after the first: the call's prompt came as messages (the output stage splits reasoning
    for every choice alike, though the forks are given token ids)."""


class Submitting:
    """The submit surface of a kernel, local or replicated: the typed request or its keyword form,
    n > 1, `generate`, `complete`, `async with`, the model's names. A subclass admits one choice in
    `submit_choice`."""

    model_name: str
    model_aliases: tuple[str, ...]

    @property
    def model_names(self) -> tuple[str, ...]:
        """Every name of the served model (a request, or a key's model allowlist, may name any of them)."""
        return (self.model_name, *self.model_aliases)

    @property
    def loras(self) -> Any:
        """The LoRA adapters served on the model (a core.lora.LoraCatalog: the runner's), None: LoRA is off."""
        return getattr(getattr(self, "runner", None), "loras", None)

    async def submit_choice(self, request: GenerateRequest, exchange: Exchange | None = None,
                            choice: Choice = Choice()) -> RequestHandle:
        """Admit one request (one choice of its call, as `choice` says) and return its handle."""
        raise NotImplementedError

    async def submit(self, request: GenerateRequest | str | None = None, /, *, exchange: Exchange | None = None,
                     **fields: Any) -> RequestHandle:
        """Run the entry pipeline on one request (n = 1), admit it, and return its handle.

        `request`: a GenerateRequest, or the prompt text with the request's fields as keywords (any
        other keyword is a sampling field). `exchange` carries what a front end knew about the client
        call (caller, task, policy, retries, client address) and collects the handles. Raises
        InvalidRequest / ContextOverflow / ContentBlocked / Unauthenticated / PermissionDenied /
        Overloaded / Unavailable before any compute, each published as `RequestRejected`.
        """
        req = as_request(request, fields)
        if req.n != 1:
            raise InvalidRequest(f"n={req.n}: submit admits one request; use submit_choices for n > 1", field="n")
        return await self.submit_choice(req, exchange)

    async def submit_choices(self, request: GenerateRequest | str | None = None, /, *,
                             exchange: Exchange | None = None, **fields: Any) -> list[RequestHandle]:
        """`submit` for the n choices of a request (`n`, see GenerateRequest), one handle each; on any
        refusal the choices admitted already are closed and the refusal raised."""
        req = as_request(request, fields)
        if req.n == 1:
            return [await self.submit_choice(req, exchange)]
        handles: list[RequestHandle] = []
        try:
            first = await self.submit_choice(req, exchange, Choice(forks=req.n - 1, sequences=req.n))
            handles.append(first)
            fork = Choice(fork_of=first.request_id, sequences=0, chat=req.messages is not None)
            for i in range(1, req.n):
                handles.append(await self.submit_choice(req.choice(i, first), exchange, fork))
        except BaseException:
            for h in handles:
                h.close()
            raise
        return handles

    async def generate(self, request: GenerateRequest | str | None = None, /,
                       **fields: Any) -> AsyncIterator[Event]:
        """Admit a request and yield its events; leaving the loop early aborts it."""
        handle = await self.submit(request, **fields)
        async with handle:
            async for event in handle:
                yield event

    async def complete(self, request: GenerateRequest | str | None = None, /, **fields: Any) -> Completion:
        """Admit a request and wait for its whole completion."""
        handle = await self.submit(request, **fields)
        async with handle:
            return await handle.result()

    async def __aenter__(self) -> Any:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    async def start(self) -> None:
        """Become ready to admit requests (the subclass's)."""
        raise NotImplementedError

    async def stop(self) -> None:
        """End what runs and release what `start` took (the subclass's)."""
        raise NotImplementedError


def as_request(request: GenerateRequest | str | None, fields: dict[str, Any]) -> GenerateRequest:
    """The typed request of a submit call: given, or built from the keyword form."""
    if isinstance(request, GenerateRequest):
        if fields:
            raise InvalidRequest(f"give a GenerateRequest or keywords, not both: {sorted(fields)}")
        return request
    if request is not None:
        if not isinstance(request, str):
            raise InvalidRequest(f"the prompt must be a string or a GenerateRequest, got {type(request).__name__}",
                                 field="prompt")
        if fields.get("prompt") is not None:
            raise InvalidRequest("the prompt is given twice (positional and prompt=)", field="prompt")
        fields = {**fields, "prompt": request}
    return GenerateRequest.of(**fields)
