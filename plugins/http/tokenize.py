"""POST /tokenize, POST /detokenize, GET /tokenizer_info in vLLM's shapes, so a client can count
and score tokens without a tokenizer of its own (lm-eval's remote tokenizer reads these).

    POST /tokenize    {"prompt": "...", "add_special_tokens": true}           -> {"count", "max_model_len", "tokens", "token_strs"}
                      {"messages": [...], "add_generation_prompt": true, ...}  (rendered with the model's chat template)
    POST /detokenize  {"tokens": [...]}                                        -> {"prompt": "..."}
    GET  /tokenizer_info                                                       -> {"eos_token", "bos_token", "pad_token", "chat_template", ...}
"""
from __future__ import annotations

from typing import Annotated, Any

import anyio
import msgspec
from aiohttp import web
from msgspec import Meta, Struct

from modelcall.plugins.http.errors import ApiError
from modelcall.plugins.http.schemas_openai import INT32, Message, TokenId, Tool
from modelcall.plugins.http.service import ServingContext, as_api_error

MAX_TOKENS_IN = 1 << 20  # ids one /detokenize call may carry


class TokenizeCompletion(Struct, kw_only=True, forbid_unknown_fields=False):
    prompt: str
    model: str | None = None
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChat(Struct, kw_only=True, forbid_unknown_fields=False):
    messages: Annotated[list[Message], Meta(min_length=1)]
    model: str | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    return_token_strs: bool = False
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class TokenizeResponse(Struct):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(Struct, kw_only=True):
    tokens: Annotated[list[TokenId], Meta(max_length=MAX_TOKENS_IN)]
    model: str | None = None


class DetokenizeResponse(Struct):
    prompt: str


_encoder = msgspec.json.Encoder()


def _decode(raw: bytes, pick: Any) -> Any:
    """The body as the struct `pick(obj)` names for the decoded JSON object; 400s name the field."""
    if not raw:
        raise ApiError(400, "the request body is empty; send a JSON object", code="invalid_json")
    try:
        obj = msgspec.json.decode(raw)
        if not isinstance(obj, dict):
            raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
        return msgspec.convert(obj, pick(obj))
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise ApiError.from_decode(e) from None
    except RecursionError:
        raise ApiError(400, "the JSON body is nested too deeply", code="invalid_json") from None


def _json(obj: Any) -> web.Response:
    return web.Response(body=_encoder.encode(obj), content_type="application/json")


async def tokenize(request: web.Request, ctx: ServingContext) -> web.Response:
    """Token ids of a prompt, or of chat messages rendered with the model's template."""
    body = _decode(await request.read(), lambda obj: TokenizeChat if "messages" in obj else TokenizeCompletion)
    is_chat = type(body) is TokenizeChat
    ctx.check_model(body.model)
    await _through_entry(ctx, body)
    tok = ctx.kernel.tokenizer
    try:
        if is_chat:
            text = await anyio.to_thread.run_sync(lambda: _render(tok, body))
        else:
            text = body.prompt
        ids = await anyio.to_thread.run_sync(lambda: tok.encode(text, add_special_tokens=body.add_special_tokens))
    except Exception as e:
        raise as_api_error(e) from e
    strs = [ctx.token_text(t) for t in ids] if body.return_token_strs else None
    return _json(TokenizeResponse(count=len(ids), max_model_len=ctx.kernel.window, tokens=ids, token_strs=strs))


async def _through_entry(ctx: ServingContext, body: TokenizeCompletion | TokenizeChat) -> None:
    """The call passes the kernel's entry steps as count_tokens does (the key's model allowlist,
    caps, input filters; one request against its rpm), so a tenant cannot use these routes to get
    around what it may not do through the generating ones."""
    if type(body) is TokenizeChat:
        from modelcall.plugins.http.openai_chat import template_messages

        tools = [msgspec.to_builtins(t) for t in body.tools] if body.tools else None
        await ctx.count_tokens(messages=template_messages(body.messages), tools=tools,
                               chat_template_kwargs=body.chat_template_kwargs)
    elif body.prompt:
        await ctx.count_tokens(prompt=body.prompt)


def _render(tok: Any, body: TokenizeChat) -> str:
    from modelcall.plugins.http.openai_chat import template_messages

    kwargs = dict(body.chat_template_kwargs or {})
    tools = [msgspec.to_builtins(t) for t in body.tools] if body.tools else None
    if body.continue_final_message:
        if body.add_generation_prompt:
            raise ApiError(400, "continue_final_message and add_generation_prompt cannot both be true",
                           param="continue_final_message")
        kwargs["continue_final_message"] = True
    return tok.apply_chat_template(template_messages(body.messages), tools=tools,
                                   add_generation_prompt=body.add_generation_prompt, **kwargs)


async def detokenize(request: web.Request, ctx: ServingContext) -> web.Response:
    """The text of token ids (special tokens kept, as vLLM)."""
    body = _decode(await request.read(), lambda obj: DetokenizeRequest)
    ctx.check_model(body.model)
    vocab = ctx.kernel.spec.vocab_size
    bad = next((t for t in body.tokens if t >= vocab), None)
    if bad is not None:
        raise ApiError(400, f"token id {bad} is outside the vocabulary [0, {vocab})", param="tokens")
    if body.tokens:
        await ctx.count_tokens(prompt_token_ids=body.tokens)
    text = await anyio.to_thread.run_sync(lambda: ctx.kernel.tokenizer.decode(body.tokens, skip_special_tokens=False))
    return _json(DetokenizeResponse(prompt=text))


async def tokenizer_info(request: web.Request, ctx: ServingContext) -> web.Response:
    """The tokenizer's special tokens, chat template and limits (vLLM's /tokenizer_info)."""
    return _json(describe(ctx))


def describe(ctx: ServingContext) -> dict[str, Any]:
    tok = ctx.kernel.tokenizer
    hf = getattr(tok, "hf", None)  # a Hugging Face tokenizer knows its own special tokens' names
    eos_ids = sorted(tok.eos_token_ids)

    def special(name: str) -> str | None:
        value = getattr(hf, name, None) if hf is not None else None
        return value if isinstance(value, str) else None

    eos = special("eos_token")
    if eos is None and eos_ids:
        eos = tok.decode([eos_ids[0]], skip_special_tokens=False)
    template = getattr(hf, "chat_template", None) if hf is not None else None
    return {
        "tokenizer_class": type(hf).__name__ if hf is not None else type(tok).__name__,
        "eos_token": eos,
        "eos_token_ids": eos_ids,
        "bos_token": special("bos_token"),
        "pad_token": special("pad_token"),
        "unk_token": special("unk_token"),
        "chat_template": template if isinstance(template, str) else None,
        "vocab_size": tok.vocab_size,
        "model_max_length": min(ctx.kernel.window, INT32),
        "max_model_len": ctx.kernel.window,
    }


def routes(ctx: ServingContext) -> list[tuple[str, str, Any]]:
    """(method, path, handler) of the three routes, served for `ctx`'s kernel."""
    def bound(fn: Any) -> Any:
        async def route(request: web.Request) -> web.Response:
            return await fn(request, ctx.bind(request))  # bound: the caller's key reaches the entry
        route.__doc__ = fn.__doc__
        return route

    return [("POST", "/tokenize", bound(tokenize)), ("POST", "/detokenize", bound(detokenize)),
            ("GET", "/tokenizer_info", bound(tokenizer_info))]
