"""The built-in pooler: mean, CLS or last-token over a request's final hidden states, then Matryoshka
truncation and L2 normalisation, as sentence-transformers' Pooling and Normalize modules compute them."""
from __future__ import annotations

from typing import Any

import torch

from modelcall.core import InvalidRequest, PoolingParams, PoolingPlan
from modelcall.core.pooling import POOLING_TYPES


class HiddenStatePooler:
    """Pools with the checkpoint's choice (`pooling`, `normalize`) unless a request asks otherwise."""

    def __init__(self, hidden_size: int, pooling: str, normalize: bool, prefix: str = "",
                 max_input_tokens: int | None = None) -> None:
        self.hidden_size = hidden_size
        self.max_input_tokens = max_input_tokens   # the checkpoint's max_seq_length
        self.default = PoolingPlan(pooling=pooling, normalize=normalize)
        self.prefix = prefix   # prepended to text inputs (the checkpoint's default prompt)

    def resolve(self, params: PoolingParams) -> PoolingPlan:
        pooling = params.pooling or self.default.pooling
        if pooling not in POOLING_TYPES:
            raise InvalidRequest(f"pooling {pooling!r}: use one of {', '.join(POOLING_TYPES)}", field="pooling")
        dims = params.dimensions
        if dims is not None and not 1 <= dims <= self.hidden_size:
            raise InvalidRequest(f"dimensions {dims}: the model's vectors have {self.hidden_size}; ask for 1 to "
                                 f"{self.hidden_size}", field="dimensions")
        normalize = self.default.normalize if params.normalize is None else params.normalize
        return PoolingPlan(pooling=pooling, normalize=normalize, dimensions=dims)

    def pool(self, parts: list[Any], token_ids: list[int], plan: PoolingPlan) -> list[float]:
        rows = parts[0] if len(parts) == 1 else torch.cat(parts)
        if plan.every_token and rows.shape[0] != len(token_ids):
            raise RuntimeError(f"pooling {plan.pooling}: {rows.shape[0]} hidden-state rows for {len(token_ids)} "
                               "prompt tokens")
        if plan.pooling == "mean":
            v = rows.mean(0)
        elif plan.pooling == "cls":
            v = rows[0]
        else:
            v = rows[-1]
        if plan.dimensions is not None:
            v = v[:plan.dimensions]
        if plan.normalize:
            v = torch.nn.functional.normalize(v, p=2, dim=0)
        return v.tolist()


class ScorePooler:
    """A cross-encoder's score: the runner's pooled row is the classification head's logits; one label gives
    sigmoid(logit) (sentence-transformers' CrossEncoder default, vLLM's), several the softmax over them."""

    task = "score"

    def __init__(self, num_labels: int, max_input_tokens: int | None = None) -> None:
        self.hidden_size = num_labels
        self.max_input_tokens = max_input_tokens

    def resolve(self, params: PoolingParams) -> PoolingPlan:
        if params.pooling not in (None, "score") or params.dimensions is not None or params.normalize:
            raise InvalidRequest("this model scores text pairs (rerank, score); it has no pooling, dimensions or "
                                 "normalize to choose", field="pooling")
        return PoolingPlan(pooling="score", normalize=False)

    def pool(self, parts: list[Any], token_ids: list[int], plan: PoolingPlan) -> list[float]:
        logits = parts[-1][0]
        return (torch.sigmoid(logits) if logits.numel() == 1 else torch.softmax(logits, 0)).tolist()
