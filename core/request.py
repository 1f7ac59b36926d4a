"""The state of one request inside the kernel: computed tokens catching up with known tokens.

    all_token_ids:  [ p0 p1 p2 ... p(P-1) | o0 o1 ... ]      P = num_prompt_tokens
                      <- num_computed_tokens ->                 (K/V written for these)
                      <- num_cached_tokens ->                   (read from the prefix cache)

Prefill, chunked prefill, prefix-cache hits and recompute after preemption are all the same
thing: the scheduler grants some of the tokens not yet computed.
"""
from __future__ import annotations

import enum
from typing import Any

from modelcall.core.params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class Request:
    """Mutable per-request state owned by the engine loop (never shared with other threads while a
    step runs, except read-only by the runner)."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, *,
                 task_id: str | None = None, priority: int = 0, arrival: float = 0.0,
                 cache_salt: str | None = None, max_tokens: int, eos_token_ids: frozenset[int] = frozenset()) -> None:
        self.request_id = request_id
        self.task_id = task_id
        self.params = params
        self.priority = priority
        self.arrival = arrival
        self.cache_salt = cache_salt
        self.max_tokens = max_tokens  # resolved against the window at admission
        self.eos_token_ids = eos_token_ids
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0      # of the prompt, from the prefix cache, at first scheduling
        self.num_cached_disk_tokens = 0  # of num_cached_tokens, read back from the disk KV tier
        self.block_table: list[int] = []
        self.block_hashes: list[Any] = []  # the KV policy's hash of each full block, in order
        self.status = Status.WAITING
        self.num_preemptions = 0
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.scheduled_once = False
        # Callables fn(output_token_ids, logits_row) -> logits_row | None (in place), applied by the
        # sampler before filtering; constrained decoding plugs in here.
        self.logits_processors: list[Any] = []
        self.sampler_state: Any = None  # per-request state of the sampler (e.g. its seeded generator)
        self.extra: dict[str, Any] = {}  # room for plugins; never read by the kernel
        # With params.prompt_logprobs: entry j is the logprob of prompt token j + 1 (token 0 has none),
        # appended by the kernel from each prefill chunk's output. Positions already here are never
        # computed again (after preemption), and the prefix cache never covers the ones still missing.
        self.prompt_logprobs: list[Any] = []
        self.prompt_ranks: list[int] = []
        self.prompt_logprobs_sent = False
        # n > 1: the request whose prompt this one shares (same ids). The scheduler may fork it from
        # that request's prefill (shared blocks, copy on write of the last partial one) instead of
        # computing the prompt again.
        self.fork_of: str | None = None
        # n > 1, on the request the others are forked from: how many will come. The scheduler holds
        # it until they are all admitted (the caller aborts it if one is refused).
        self.num_forks = 0
        # A pooling request (core/pooling.py): its resolved PoolingPlan, and the runner's hidden-state
        # rows so far by the position they start at (a recompute after preemption overwrites them).
        self.pooling: Any = None
        self.pooled: dict[int, Any] = {}
        # The LoRA adapter the request runs on (core.lora.LoraRef: its name and load key), None: the base model.
        # Its key is part of the prefix-cache root, so no block is shared across adapters.
        self.lora: Any = None

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens:]

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.all_token_ids[:self.num_prompt_tokens]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_computed_tokens

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Prompt logprobs were asked and some are still to compute."""
        return self.params.prompt_logprobs is not None and len(self.prompt_logprobs) < self.num_prompt_tokens - 1

    @property
    def pools_every_token(self) -> bool:
        """A pooling request whose pooler reads every prompt token's state: no prefix-cache hit may skip one."""
        return self.pooling is not None and self.pooling.every_token

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, blocks={len(self.block_table)})")
