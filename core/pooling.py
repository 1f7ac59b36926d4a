"""The pooling task: a request that wants a vector, not tokens (embeddings). Its prompt is prefilled in the
same batches as generation; the runner hands back its hidden states (`StepOutput.pooled`) and the model's
`Pooler` (provided by a plugin through `provide_pooler`) turns them into one vector at the prompt's end.

    handle = await kernel.submit(GenerateRequest(prompt="a sentence", pooling=PoolingParams()))
    vector = (await handle.result()).embedding
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import msgspec

POOLING_TYPES = ("mean", "cls", "last")   # a scorer's (cross-encoder's) plan is "score"


class PoolingParams(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """How to pool one request's hidden states; None fields take the checkpoint's own choice."""

    pooling: str | None = None
    """"mean" (over every prompt token), "cls" (the first token's state), "last" (the last token's)."""
    normalize: bool | None = None
    """Scale the vector to unit L2 norm (sentence-transformers' Normalize module)."""
    dimensions: int | None = None
    """Matryoshka: keep the first `dimensions` components, then renormalise when normalizing."""


class PoolingPlan(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """PoolingParams resolved against the checkpoint at entry: nothing left to choose."""

    pooling: str
    normalize: bool
    dimensions: int | None = None

    @property
    def every_token(self) -> bool:
        """The pooler reads every prompt token's state (so no prefix-cache hit may skip one)."""
        return self.pooling != "last"


@runtime_checkable
class Pooler(Protocol):
    """The model's pooling stage.

    `resolve` runs at entry, on the event loop: it fills the checkpoint's defaults and refuses what the
    model cannot do (raise `InvalidRequest`, e.g. `dimensions` above the hidden size). `pool` runs once
    per request when its prompt is computed, on the event loop: `parts` are the runner's hidden-state
    rows for the request's chunks in position order (every prompt token's for `every_token` plans, only
    the last token's otherwise), `token_ids` the prompt. It returns the vector as floats.

    Optional attribute `task`: "embed" (the default: vectors) or "score" (a cross-encoder: a text pair's
    relevance, the front end's rerank and score routes).
    """

    hidden_size: int
    """The vector's length (for a scorer: its labels)."""
    max_input_tokens: int | None
    """The longest input it pools (None: the model's window); a longer one is refused at entry."""

    def resolve(self, params: PoolingParams) -> PoolingPlan: ...

    def pool(self, parts: list[Any], token_ids: list[int], plan: PoolingPlan) -> list[float]: ...
