"""The Entry pipeline: every input form reaches the engine through these steps, in this order.

    caller → validate → render → tokenize → context budget → input filters
           → permissions (model, tools, priority, cache scope) → quota reservation → admit

`Kernel.submit_choice` (every submit) runs `Entry.run` and then admits what it returns; `Kernel.count_tokens`
runs the same steps up to the quota (a count is one request for rpm, no tokens). Text, chat messages,
token ids, Anthropic and Responses requests differ only in how a front end fills the `GenerateRequest`;
a front end decides nothing that a step here decides. Every refusal is a core error (a 4xx),
published once as `RequestRejected` naming the step, so the ledger and /metrics see it.
"""
from __future__ import annotations

import time
from typing import Any, NoReturn

import anyio
import msgspec

from modelcall.core.admission import admit_chat, check_policy
from modelcall.core.caps import check_caps
from modelcall.core.context import message_text
from modelcall.core.errors import (
    ContentBlocked, ContextOverflow, InvalidRequest, ModelcallError, ModelNotFound, Overloaded, Unauthenticated,
    Unavailable,
)
from modelcall.core.metering import Admission, Caller, Exchange, tool_names
from modelcall.core.params import SamplingParams
from modelcall.core.permissions import cache_salt, check_lora, check_model, check_tools, effective_priority
from modelcall.core.prompt import INLINE_ENCODE_CHARS, chat_token_ids, prompt_token_ids_of, resolve_max_tokens
from modelcall.core.safety import check_input
from modelcall.core.submit import Choice, GenerateRequest
from modelcall.events import RequestRejected


class EntryInput(msgspec.Struct, kw_only=True):
    """One request on its way through the entry steps: the request as its caller gave it (never changed
    here), and what the steps resolve from it and from the exchange."""

    request: GenerateRequest
    request_id: str
    params: SamplingParams | None = None  # the validate step's, from request.params or request.param_fields
    caller: Caller | None = None          # the request's, or the exchange's
    task_id: str | None = None
    context_policy: str | None = None
    retries: int = 0
    sequences: int = 1                    # sequences this submit adds to its client call (n of the first choice)
    fork_of: str | None = None            # n > 1: the choice whose prompt this one shares (and is charged to)
    exchange: Exchange | None = None

    @classmethod
    def of(cls, request: GenerateRequest, request_id: str, choice: Choice, exchange: Exchange | None) -> EntryInput:
        r = request
        return cls(request=r, request_id=request_id, params=r.params, caller=r.caller, task_id=r.task_id,
                   context_policy=r.context_policy, retries=r.retries, sequences=choice.sequences,
                   fork_of=choice.fork_of, exchange=exchange)


class Entered(msgspec.Struct, kw_only=True):
    """What the pipeline decided: the prompt, its budget and the terms it runs under."""

    ids: list[int]
    max_tokens: int
    params: SamplingParams
    priority: int
    cache_salt: str | None
    caller: Caller | None
    task_id: str | None
    retries: int
    parts: dict[str, int] | None = None
    context: dict[str, Any] | None = None
    prepared: Any = None  # the tool-call parser stream and constraint processors (core/tools/support.py)
    pooling: Any = None   # a pooling request's PoolingPlan (core/pooling.py)
    lora: Any = None      # the LoRA adapter it runs on (core.lora.LoraRef), None: the base model


class Entry:
    """The entry steps of one kernel (it reads the kernel's stages, which are set at start)."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel

    async def run(self, inp: EntryInput) -> Entered:
        """Every step up to and including the quota reservation; raises (and publishes) a refusal."""
        step = "caller"
        try:
            caller = self._caller(inp)
            step = "validate"
            params, policy = self._validate(inp)
            pooling = self._pooling(inp)
            step = "render"  # render, tokenize (and for chat the budget) share one worker-thread hop
            if inp.request.messages is not None and inp.request.prompt is None and inp.request.prompt_token_ids is None:
                at = [step]
                try:
                    max_tokens, parts, context, ids = await self._chat(inp, params, policy, at)
                finally:
                    step = at[0]
            else:
                ids = await self._tokens(inp)
                step = "context budget"
                max_tokens = self._budget(ids, params) if pooling is None else self._pool_budget(ids)
                parts, context = None, None
            step = "input filters"
            await self._filter_input(inp, ids)
            step = "permissions"
            priority, salt = self._permissions(inp, caller)
            lora = await self._lora(inp, caller)
            step = "tools"  # parsers and constraints, after permissions: a forbidden tool compiles nothing
            prepared = await self._prepare_tools(inp)
            step = "quota"
            self._reserve(inp, caller, 0 if inp.fork_of is not None else len(ids), max_tokens)
            step = "admit"
            self._check_queue()
        except ModelcallError as e:
            self.refuse(inp, e, step)
            raise
        if inp.exchange is not None:
            inp.exchange.sequences += inp.sequences
        return Entered(ids=ids, max_tokens=max_tokens, params=params, priority=priority, cache_salt=salt,
                       caller=caller, task_id=inp.task_id, retries=inp.retries, parts=parts, context=context,
                       prepared=prepared, pooling=pooling, lora=lora)

    async def count(self, inp: EntryInput) -> int:
        """The prompt's token count, through the same steps as a request (no budget, no admission)."""
        step = "caller"
        try:
            caller = self._caller(inp)
            step = "validate"
            self._validate(inp)
            step = "render"
            ids = await self._tokens(inp)
            step = "input filters"
            await self._filter_input(inp, ids)
            step = "permissions"
            self._permissions(inp, caller)
            step = "quota"
            self._reserve(inp, caller, len(ids), 0, count_only=True)
        except ModelcallError as e:
            self.refuse(inp, e, step)
            raise
        return len(ids)

    def refuse(self, inp: EntryInput, error: ModelcallError, step: str) -> None:
        caller = inp.caller
        if inp.exchange is not None:
            inp.exchange.refused = True
        self.kernel.bus.publish((RequestRejected(
            request_id=inp.request_id, task_id=inp.task_id, status=error.status, error_type=error.error_type,
            message=str(error), caller=caller.name if caller is not None else None, step=step,
            client=inp.exchange.client if inp.exchange is not None else None),))

    # ---- the steps ----------------------------------------------------------------------------

    def _caller(self, inp: EntryInput) -> Caller | None:
        ex = inp.exchange
        if ex is not None:  # what the front end knew about this exchange fills what the call left unset
            inp.caller = inp.caller if inp.caller is not None else ex.caller
            inp.task_id = inp.task_id if inp.task_id is not None else ex.task_id
            inp.context_policy = inp.context_policy or ex.context_policy
            inp.retries = inp.retries or ex.retries
        caller = inp.caller
        if caller is not None and caller.expires_at is not None and time.time() >= caller.expires_at:
            raise Unauthenticated(f"the API key {caller.name!r} has expired")
        k = self.kernel
        if k.engine is None or not k.engine.alive or k.draining:
            raise Unavailable("the kernel is not accepting requests (starting, draining or stopped)")
        return caller

    def _validate(self, inp: EntryInput) -> tuple[SamplingParams, str]:
        if inp.params is None:
            inp.params = SamplingParams.create(**inp.request.param_fields)
        elif inp.request.param_fields:
            raise InvalidRequest(f"give either params or sampling fields, not both: {sorted(inp.request.param_fields)}")
        params = inp.params
        admitted = inp.exchange.sequences if inp.exchange is not None else 0
        check_caps(self.kernel.config, inp.request.messages, inp.request.tools, params, admitted, inp.sequences)
        return params, check_policy(inp.context_policy)

    def _pooling(self, inp: EntryInput) -> Any:
        """A pooling request's plan from the model's pooler; a generation request to a model that only pools
        is refused here, before any compute."""
        k, r = self.kernel, inp.request
        if r.pooling is None:
            if not getattr(k.runner, "generates", True):
                raise InvalidRequest(f"model {k.model_name!r} is an embedding model (it generates no tokens); "
                                     "use /v1/embeddings (a pooling request)", field="model")
            return None
        if k.pooler is None:
            raise InvalidRequest(f"model {k.model_name!r} serves no pooling requests (no plugin pools it)",
                                 field="model")
        if r.messages is not None or r.tools:
            raise InvalidRequest("a pooling request takes a prompt or prompt token ids, not messages or tools",
                                 field="messages")
        return k.pooler.resolve(r.pooling)

    async def _tokens(self, inp: EntryInput) -> list[int]:
        k = self.kernel
        try:
            r = inp.request
            if r.pooling is not None and r.prompt is not None:
                # NOTE: with the special tokens ([CLS] ... [SEP], a BOS or EOS), as sentence-transformers encodes
                text = getattr(k.pooler, "prefix", "") + r.prompt   # the checkpoint's default prompt, if any
                if len(text) <= INLINE_ENCODE_CHARS:   # as prompt_token_ids_of: a hop costs more than a short encode
                    return k.tokenizer.encode(text, add_special_tokens=True)
                return await anyio.to_thread.run_sync(lambda: k.tokenizer.encode(text, add_special_tokens=True))
            return await prompt_token_ids_of(k.tokenizer, k.spec.vocab_size, r.prompt, r.messages, r.tools,
                                             r.prompt_token_ids, r.chat_template_kwargs)
        except ModelcallError:
            raise
        except Exception as e:
            _raise_input_error(e, inp)

    async def _chat(self, inp: EntryInput, params: SamplingParams, policy: str, at: list[str]
                    ) -> tuple[int, dict[str, int] | None, dict[str, Any] | None, list[int]]:
        """render → tokenize → context budget of a chat prompt, in one worker-thread hop; `at[0]`
        follows the step (so a refusal names the right one)."""
        k = self.kernel
        r = inp.request
        tok, messages, tools, kw = k.tokenizer, r.messages, r.tools, r.chat_template_kwargs
        assert messages is not None

        def work() -> Any:
            try:
                ids = chat_token_ids(tok, messages, tools, kw)
            except ModelcallError:
                raise
            except Exception as e:
                _raise_input_error(e, inp)
            at[0] = "context budget"
            return admit_chat(tok, messages, tools, kw, ids,
                              lambda n: resolve_max_tokens(n, params, k.window, k.kv), policy)

        chat = await anyio.to_thread.run_sync(work)
        context = None
        if chat.dropped_messages:
            context = {"policy": policy, "dropped_messages": chat.dropped_messages,
                       "dropped_tokens": chat.dropped_tokens}
        return chat.max_tokens, chat.parts, context, chat.ids

    def _pool_budget(self, ids: list[int]) -> int:
        """A pooling request's budget: its prompt within the window and the KV pool; it generates nothing (0)."""
        k = self.kernel
        if not ids:
            raise InvalidRequest("a pooling request needs at least one token", field="input")
        limit = min(k.window, getattr(k.pooler, "max_input_tokens", None) or k.window)
        if len(ids) > limit:   # refused, not cut: sentence-transformers would truncate silently
            raise ContextOverflow(len(ids), 0, limit)
        need = -(-len(ids) // k.kv.block_size)
        if need > k.kv.num_blocks:
            raise InvalidRequest(f"the input ({len(ids)} tokens) needs {need} KV blocks but the cache holds "
                                 f"{k.kv.num_blocks}; raise kv_cache_memory_gb", field="input")
        return 0

    def _budget(self, ids: list[int], params: SamplingParams) -> int:
        """The context budget of a text or token-id prompt (a chat prompt's is in `_chat`)."""
        k = self.kernel
        return resolve_max_tokens(len(ids), params, k.window, k.kv)

    async def _filter_input(self, inp: EntryInput, ids: list[int]) -> None:
        k = self.kernel
        if not k.safety_filters:
            return
        if inp.request.prompt_token_ids is not None:
            texts = await _decoded(k.tokenizer, ids)
        elif inp.request.prompt is not None:
            texts = [inp.request.prompt]
        else:
            texts = [message_text(m) for m in inp.request.messages or ()]
        blocked = check_input(k.safety_filters, texts)
        if blocked is not None:
            raise ContentBlocked(*blocked)

    def _permissions(self, inp: EntryInput, caller: Caller | None) -> tuple[int, str | None]:
        check_model(caller, self.kernel.model_names)
        check_tools(caller, tool_names(inp.request.tools))
        return effective_priority(caller, inp.request.priority), cache_salt(caller, inp.request.cache_salt)

    async def _lora(self, inp: EntryInput, caller: Caller | None) -> Any:
        """The request's adapter: served here (404), usable by the caller (403), its weights loaded (a worker
        thread reads them if they were evicted, so the step does not)."""
        name = inp.request.lora
        if name is None:
            return None
        catalog = self.kernel.loras
        if catalog is None or catalog.ref(name) is None:
            raise ModelNotFound(f"the model {name!r} does not exist (no LoRA adapter of that name is served)")
        check_lora(caller, name)
        if inp.request.pooling is not None:
            raise InvalidRequest("a pooling request runs on the base model, not on a LoRA adapter", field="model")
        return await anyio.to_thread.run_sync(catalog.acquire, name)

    async def _prepare_tools(self, inp: EntryInput) -> Any:
        k = self.kernel
        if k.tools is None:
            return None
        eos, ts, r = k.spec.eos_token_ids | k.tokenizer.eos_token_ids, k.tools, inp.request
        if not (r.tools or r.tool_choice is not None or r.response_format is not None or r.tool_parser
                or r.logits_processors):
            return None  # NOTE: nothing to parse or constrain (what prepare returns then), no thread hop
        return await anyio.to_thread.run_sync(lambda: ts.prepare(
            request_id=inp.request_id, task_id=inp.task_id, eos_token_ids=eos, tools=r.tools,
            tool_choice=r.tool_choice, response_format=r.response_format,
            parallel_tool_calls=r.parallel_tool_calls, tool_parser=r.tool_parser,
            logits_processors=r.logits_processors))

    def _reserve(self, inp: EntryInput, caller: Caller | None, prompt_tokens: int, max_tokens: int,
                 count_only: bool = False) -> None:
        k = self.kernel
        if not k._reservers:
            return
        adm = Admission(request_id=inp.request_id, task_id=inp.task_id, model=k.model_name, caller=caller,
                        prompt_tokens=prompt_tokens, max_tokens=max_tokens, tools=tool_names(inp.request.tools),
                        count_only=count_only)
        for meter in k._reservers:  # a refusal's RequestRejected lets earlier meters release
            meter.reserve(adm)

    def _check_queue(self) -> None:
        # NOTE: requests admitted while a step runs wait in the engine's inbox, not yet in the
        # scheduler: those beyond the free running slots will wait, and a burst would overshoot
        # max_queued if they were not counted.
        k = self.kernel
        free_slots = max(0, k.config.max_num_seqs - k.scheduler.num_running)
        waiting = k.scheduler.num_waiting + max(0, k.engine.num_pending - free_slots)
        if waiting >= k.config.max_queued:
            raise Overloaded(f"{waiting} requests are waiting (limit {k.config.max_queued})")


INLINE_DECODE = 2048  # token ids decoded on the event loop up to this many (a thread hop costs more)


async def _decoded(tok: Any, ids: list[int]) -> list[str]:
    """The texts input filters read for a token-id prompt.

    NOTE: token ids are text too: a blocked term sent as ids must not pass. Decoded with special
    tokens kept, and, when the ids hold any, also without them (a term split by special tokens).
    """
    specials = getattr(tok, "special_token_ids", None)
    both = specials is None or not specials.isdisjoint(ids)

    def decode() -> list[str]:
        kept = tok.decode(ids, skip_special_tokens=False)
        if not both:
            return [kept]
        skipped = tok.decode(ids, skip_special_tokens=True)
        return [kept] if skipped == kept else [kept, skipped]

    return decode() if len(ids) <= INLINE_DECODE else await anyio.to_thread.run_sync(decode)


def _raise_input_error(e: Exception, inp: EntryInput) -> NoReturn:
    """Raise, for an exception met while preparing the prompt: a template's raise_exception or odd
    unicode is the input's fault (InvalidRequest, never a 500); anything else (a bug) as it was."""
    if isinstance(e, (ValueError, TypeError, UnicodeError, LookupError)) or _is_template_error(e):
        raise InvalidRequest(f"the prompt could not be prepared: {type(e).__name__}: {e}",
                             field="messages" if inp.request.messages is not None else "prompt") from e
    raise e


def _is_template_error(e: BaseException) -> bool:
    return bool({c.__name__ for c in type(e).__mro__} & {"TemplateError", "UndefinedError"})
