"""`POST /v1/embeddings` in the OpenAI shape: each input becomes one pooling request (core/pooling.py), admitted
by the same entry pipeline and queue as generation and prefilled in the same batches; a call's inputs (up to 2,048)
are fed through a window of max_sequences_per_call in flight (pooling_window.py).

    {"model": "...", "input": "text" | ["text", ...] | [ids...] | [[ids...], ...],
     "encoding_format": "float" | "base64", "dimensions": 256}
    -> {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [...] | "base64"}],
        "model": "...", "usage": {"prompt_tokens": N, "total_tokens": N}}
"""
from __future__ import annotations

import base64
import sys
from array import array
from collections.abc import Awaitable
from typing import Annotated, Any, Literal

import msgspec
from aiohttp import web
from msgspec import Meta, Struct

from modelcall.core import ContextOverflow, GenerateRequest, PoolingParams, RequestHandle
from modelcall.plugins.http.errors import ApiError
from modelcall.plugins.http.pooling_window import check_call_size, pool_all
from modelcall.plugins.http.service import ServingContext, as_api_error


class EmbeddingRequest(Struct):
    input: str | list[Any]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    user: str | None = None
    # vLLM's extras: normalize (None: the checkpoint's choice), priority, cache salt
    normalize: bool | None = None
    priority: int | None = None
    cache_salt: str | None = None


class EmbeddingUsage(Struct):
    prompt_tokens: int
    total_tokens: int


class Embedding(Struct):
    index: int
    embedding: list[float] | str
    object: Literal["embedding"] = "embedding"


class EmbeddingList(Struct):
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
    object: Literal["list"] = "list"


encoder = msgspec.json.Encoder()


def inputs_of(body: EmbeddingRequest) -> list[dict[str, Any]]:
    """Each input as a prompt (text or token ids); a 400 naming the input's index when one is neither."""
    raw = body.input
    if isinstance(raw, str):
        return [{"prompt": raw}]
    if not raw:
        raise ApiError(400, "input is empty; give a string, a list of strings, token ids or lists of token ids",
                       param="input")
    if all(type(x) is int for x in raw):
        return [{"prompt_token_ids": raw}]
    check_call_size(len(raw), "input")
    out = []
    for i, x in enumerate(raw):
        if isinstance(x, str):
            out.append({"prompt": x})
        elif isinstance(x, list) and x and all(type(t) is int for t in x):
            out.append({"prompt_token_ids": x})
        else:
            raise ApiError(400, f"input[{i}] is neither a string nor a non-empty list of token ids", param=f"input[{i}]")
    return out


def encode_vector(vector: list[float], fmt: str) -> list[float] | str:
    """base64: the little-endian float32 bytes (what the openai SDK decodes with numpy's frombuffer)."""
    if fmt == "float":
        return vector
    packed = array("f", vector)
    if sys.byteorder != "little":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")


async def handle(request: web.Request, ctx: ServingContext, body: EmbeddingRequest) -> web.Response:
    model = ctx.check_model(body.model)
    if "embed" not in ctx.kernel.task.split(","):
        raise ApiError(400, f"model {model!r} serves {ctx.kernel.task!r}, not embeddings", param="model")
    prompts = inputs_of(body)
    pooling = PoolingParams(normalize=body.normalize, dimensions=body.dimensions)

    def admit(i: int) -> Awaitable[RequestHandle]:
        return _submit(ctx, i, GenerateRequest(**prompts[i], pooling=pooling, priority=body.priority,
                                               cache_salt=body.cache_salt))

    data, used = [], 0
    for i, done in enumerate(await pool_all(ctx, len(prompts), admit)):
        if done.embedding is None:   # aborted (the server is stopping)
            raise ApiError(503, f"input[{i}] was not pooled (finished: {done.finish_reason})")
        data.append(Embedding(index=i, embedding=encode_vector(done.embedding, body.encoding_format)))
        used += done.usage.prompt_tokens
    out = EmbeddingList(data=data, model=model, usage=EmbeddingUsage(prompt_tokens=used, total_tokens=used))
    return web.Response(body=encoder.encode(out), content_type="application/json")


async def _submit(ctx: ServingContext, i: int, request: GenerateRequest) -> RequestHandle:
    """Admit input i; a refusal names the input by its index."""
    try:
        return await ctx.kernel.submit(request, exchange=ctx.exchange)
    except ContextOverflow as e:
        raise ApiError(400, f"input[{i}] has {e.prompt_tokens} tokens; this model takes at most {e.window} per "
                       "input (shorten or split it)", param=f"input[{i}]", code="context_length_exceeded") from e
    except BaseException as e:
        err = as_api_error(e)
        if isinstance(err, ApiError):
            err.message = f"input[{i}]: {err.message}"
            err.param = err.param if err.param in ("model", "dimensions", "pooling") else f"input[{i}]"
        raise err from e
