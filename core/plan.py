"""What crosses between scheduler, runner and kernel in one engine step."""
from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass(slots=True)
class SchedulePlan:
    """One step's work. Chunks of requests that need sampling come first is NOT promised."""

    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)   # lost their blocks this step
    newly_scheduled: list[Request] = field(default_factory=list)  # scheduled for the first time
    # (source block, destination block): copy the K/V of these blocks after this step's forward and
    # before sampling (copy on write of a forked request's last partial block).
    block_copies: list[tuple[int, int]] = field(default_factory=list)

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
    forward_s: float = 0.0


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
