"""Cross-encoder routes: `/v1/rerank` (also `/rerank`, `/v2/rerank`; Cohere's and Jina's shape, as vLLM serves it)
and `/v1/score` (also `/score`; vLLM's shape). Each (query, document) pair is one pooling request of a
sequence-classification model, encoded as a pair ([CLS] query [SEP] document [SEP]) and scored by its head.

    /v1/rerank {"query": "...", "documents": ["..." | {"text": "..."}], "top_n": 3, "return_documents": true}
      -> {"id", "model", "results": [{"index", "relevance_score", "document": {"text"}}], "usage": {"total_tokens"}}
    /v1/score  {"text_1": "..." | [...], "text_2": "..." | [...]}   (1 to N, or N to N)
      -> {"id", "object": "list", "created", "model", "data": [{"index", "object": "score", "score"}], "usage"}
"""
from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

import msgspec
from aiohttp import web
from msgspec import Meta, Struct

from modelcall.core import ContextOverflow, GenerateRequest, PoolingParams, RequestHandle
from modelcall.plugins.http.errors import ApiError
from modelcall.plugins.http.pooling_window import check_call_size, pool_all
from modelcall.plugins.http.service import ServingContext, as_api_error, unix_time


class RerankRequest(Struct):
    query: str
    documents: list[Any]
    model: str | None = None
    top_n: Annotated[int, Meta(ge=0)] | None = None
    return_documents: bool = True
    priority: int | None = None


class ScoreRequest(Struct):
    text_1: str | list[str]
    text_2: str | list[str]
    model: str | None = None
    priority: int | None = None


class RerankDocument(Struct):
    text: str


class RerankResult(Struct, omit_defaults=True):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankUsage(Struct):
    total_tokens: int


class RerankResponse(Struct):
    id: str
    model: str
    results: list[RerankResult]
    usage: RerankUsage


class ScoreData(Struct):
    index: int
    score: float
    object: Literal["score"] = "score"


class ScoreUsage(Struct):
    prompt_tokens: int
    total_tokens: int


class ScoreResponse(Struct):
    id: str
    created: int
    model: str
    data: list[ScoreData]
    usage: ScoreUsage
    object: Literal["list"] = "list"


encoder = msgspec.json.Encoder()


def _document_text(doc: Any, i: int) -> str:
    if isinstance(doc, str):
        return doc
    if isinstance(doc, dict) and isinstance(doc.get("text"), str):
        return doc["text"]
    raise ApiError(400, f"documents[{i}] is neither a string nor an object with a text field", param=f"documents[{i}]")


async def rerank(request: web.Request, ctx: ServingContext, body: RerankRequest) -> web.Response:
    model = _check(ctx, body.model)
    docs = [_document_text(d, i) for i, d in enumerate(body.documents)]
    if not docs:
        raise ApiError(400, "documents is empty", param="documents")
    scores, used = await _score_pairs(ctx, [(body.query, d) for d in docs], "documents", body.priority)
    order = sorted(range(len(docs)), key=lambda i: -scores[i])
    top = order[:body.top_n] if body.top_n else order
    results = [RerankResult(index=i, relevance_score=scores[i],
                            document=RerankDocument(text=docs[i]) if body.return_documents else None) for i in top]
    out = RerankResponse(id=f"rerank-{uuid.uuid4().hex[:16]}", model=model, results=results,
                         usage=RerankUsage(total_tokens=used))
    return web.Response(body=encoder.encode(out), content_type="application/json")


async def score(request: web.Request, ctx: ServingContext, body: ScoreRequest) -> web.Response:
    model = _check(ctx, body.model)
    first = [body.text_1] if isinstance(body.text_1, str) else body.text_1
    second = [body.text_2] if isinstance(body.text_2, str) else body.text_2
    if not first or not second:
        raise ApiError(400, "text_1 and text_2 must not be empty", param="text_1" if not first else "text_2")
    if len(first) == 1:
        first = first * len(second)
    if len(first) != len(second):
        raise ApiError(400, f"text_1 has {len(first)} texts and text_2 {len(second)}: give one text_1, or as many "
                       "as text_2", param="text_2")
    scores, used = await _score_pairs(ctx, list(zip(first, second)), "text_2", body.priority)
    out = ScoreResponse(id=f"score-{uuid.uuid4().hex[:16]}", created=unix_time(), model=model,
                        data=[ScoreData(index=i, score=s) for i, s in enumerate(scores)],
                        usage=ScoreUsage(prompt_tokens=used, total_tokens=used))
    return web.Response(body=encoder.encode(out), content_type="application/json")


def _check(ctx: ServingContext, model: str | None) -> str:
    name = ctx.check_model(model)
    if "score" not in ctx.kernel.task.split(","):
        raise ApiError(400, f"model {name!r} serves {ctx.kernel.task!r}; rerank and score need a "
                       "sequence-classification (cross-encoder) model", param="model")
    return name


async def _score_pairs(ctx: ServingContext, pairs: list[tuple[str, str]], field: str,
                       priority: int | None) -> tuple[list[float], int]:
    """Each pair scored by one pooling request (fed through the call's window); the scores in order and the prompt
    tokens they took."""
    check_call_size(len(pairs), field)
    encode_pair = getattr(ctx.kernel.tokenizer, "encode_pair", None)
    if encode_pair is None:
        raise ApiError(400, "this model's tokenizer cannot encode text pairs", param="model")

    async def admit(i: int) -> RequestHandle:
        req = GenerateRequest(prompt_token_ids=encode_pair(*pairs[i]), pooling=PoolingParams(), priority=priority)
        try:
            return await ctx.kernel.submit(req, exchange=ctx.exchange)
        except ContextOverflow as e:
            raise ApiError(400, f"{field}[{i}] with its query has {e.prompt_tokens} tokens; this model takes at "
                           f"most {e.window}", param=f"{field}[{i}]", code="context_length_exceeded") from e
        except BaseException as e:
            raise as_api_error(e) from e

    scores, used = [], 0
    for i, done in enumerate(await pool_all(ctx, len(pairs), admit)):
        if done.embedding is None:
            raise ApiError(503, f"{field}[{i}] was not scored (finished: {done.finish_reason})")
        scores.append(done.embedding[0])
        used += done.usage.prompt_tokens
    return scores, used
