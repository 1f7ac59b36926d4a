"""What crosses between scheduler, runner and kernel in one engine step."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from modelcall.core.request import Request
from modelcall.events.types import PositionLogprobs


@dataclass(slots=True)
class ScheduledChunk:
    """`num_new_tokens` tokens of `request`, from position `request.num_computed_tokens` on.

    `sample` is True when the chunk reaches the last known token: the runner then samples the
    next token from the chunk's last position.
    """

    request: Request
    num_new_tokens: int
    sample: bool
    # A fork (n > 1): this chunk computes nothing (num_new_tokens 0) and samples its first token from
    # the last row of `fork_of`'s chunk in the same plan, whose prompt it shares.
    fork_of: Request | None = None
    # Speculative decoding (core/speculative.py): proposed tokens after the request's last known one.
    # `num_new_tokens` counts them (1 + len(draft)); the runner feeds them after the known token and
    # the sampler verifies them at those rows.
    draft: list[int] | None = None


@dataclass(slots=True)
class SchedulePlan:
    """One step's work. Chunks of requests that need sampling come first is NOT promised."""

    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)   # lost their blocks this step
    newly_scheduled: list[Request] = field(default_factory=list)  # scheduled for the first time
    # (source block, destination block): copy the K/V of these blocks after this step's forward and
    # before sampling (copy on write of a forked request's last partial block).
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    num_draft_tokens: int = 0  # sum of the chunks' drafts (0: no chunk speculates this step)
    # A decode burst (core/burst.py): run this pure-decode plan up to `num_steps` steps in one execute, each
    # step's sampled tokens the next one's inputs (blocks for them allocated beforehand). 1: one step.
    num_steps: int = 1

    @property
    def num_tokens(self) -> int:
        return sum(c.num_new_tokens for c in self.chunks)

    def __bool__(self) -> bool:
        return bool(self.chunks)


@dataclass(slots=True)
class StepOutput:
    """The runner's answer, aligned with `plan.chunks`: a token (or None) per chunk."""

    token_ids: list[int | None]
    logprobs: list[PositionLogprobs | None] | None = None
    # Per chunk: the logprobs of the prompt tokens after the chunk's rows that asked for them
    # (request.prompt_logprobs grows by these), and the rank of each of those tokens.
    prompt_logprobs: list[list[PositionLogprobs] | None] | None = None
    prompt_ranks: list[list[int] | None] | None = None
    # With drafts: per chunk, None (no draft) or the tokens to append: the accepted drafts, then the
    # correction or bonus token (token_ids[i] is its first).
    spec_tokens: list[list[int] | None] | None = None
    # Pooling requests (core/pooling.py): chunk index -> the chunk's final hidden-state rows (every row when
    # the request pools every token, else the prompt's last row once the chunk reaches it), float32 on the host.
    pooled: dict[int, Any] | None = None
    forward_s: float = 0.0
    # A decode burst (plan.num_steps > 1): every step's tokens in plan order (`token_ids` is the first's) and the
    # event clock's time at each step's end; a runner may stop a burst early (fewer steps than asked).
    burst: list[list[int]] | None = None
    burst_ts: list[float] | None = None


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What the kernel and the KV policy need to know of the loaded model."""

    name: str
    max_model_len: int
    vocab_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    device: str
    eos_token_ids: frozenset[int] = frozenset()
    identity: str = ""  # goes into prefix-cache keys: two models never share cached blocks
    layer_windows: tuple[int, ...] = ()  # per layer: sliding window in tokens, 0 = full attention; () unknown


# NOTE: the KV policy keeps the block tables of KV groups 1.. (group 0's is request.block_table) in
# request.extra[GROUP_TABLES] as a list of lists; the runner reads them to place each group's K/V.
GROUP_TABLES = "kv_group_tables"


@dataclass(frozen=True, slots=True)
class KVGroup:
    """Layers whose K/V share one block table: all full attention (`window` 0) or all one sliding window."""

    window: int
    layers: tuple[int, ...]


def kv_groups(layer_windows: tuple[int, ...], num_layers: int) -> tuple[KVGroup, ...]:
    """How the KV pool is shared between a model's layers (vLLM's hybrid allocator, simplified).

    One kind of layer: one group of every layer (a block holds all of them). Mixed full and sliding
    layers: groups of equal size G (the count of the scarcest kind), each with its own block table
    over the one pool, so a sliding group gives back blocks that left its window while the full groups
    keep theirs. Group 0 is a full one when there is one (its table is `request.block_table`).

        Gemma 3 (5 sliding : 1 full), 12 layers, G = 2:
          group 0  full    layers 5, 11        table: every block of the context
          group 1  window  layers 0, 1         table: the last window / block_size blocks
          ...      window  layers 2, 3 | 4, 6 | 7, 8 | 9, 10
    """
    windows = tuple(layer_windows) or (0,) * num_layers
    kinds = sorted(set(windows))                      # 0 (full) first
    if len(kinds) == 1:
        return (KVGroup(kinds[0], tuple(range(num_layers))),)
    by_kind = {k: [i for i, w in enumerate(windows) if w == k] for k in kinds}
    size = min(len(v) for v in by_kind.values())
    return tuple(KVGroup(k, tuple(layers[i:i + size])) for k, layers in by_kind.items()
                 for i in range(0, len(layers), size))
