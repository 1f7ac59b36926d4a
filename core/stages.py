"""The contracts of the stages a plugin can supply. A plugin author reads these, not the built-ins.

Each provider hook (`core/hookspecs.py`) returns one object satisfying one of these protocols.
The kernel calls them from the engine loop (scheduler, KV policy: plain Python, no torch, no
I/O, microseconds) or from a worker thread (runner, sampler: the forward pass).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from modelcall.core.plan import ModelSpec, SchedulePlan, StepOutput
from modelcall.core.request import Request


@runtime_checkable
class IncrementalDetokenizer(Protocol):
    """Turns a request's output tokens into text piece by piece."""

    def push(self, token_ids: Sequence[int]) -> str:
        """Take newly generated tokens; return the text they complete.

        Must never return part of a multi-byte character: bytes of an unfinished character
        are held until a later token completes them (or `flush` gives them up as U+FFFD).
        The concatenation of all returned pieces equals decoding all tokens at once.
        """
        ...

    def flush(self) -> str:
        """The request ended: return whatever is still held back."""
        ...


@runtime_checkable
class Tokenizer(Protocol):
    """Text to tokens and back, and the model's chat template."""

    name: str
    eos_token_ids: frozenset[int]
    vocab_size: int

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`. Special-token strings in `text` map to their ids."""
        ...

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        ...

    def apply_chat_template(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
                            add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """Render OpenAI-style `messages` (and tool definitions) to the prompt text the model expects.

        Raises `InvalidRequest` when the messages cannot be rendered (e.g. a role the template
        does not know).
        """
        ...

    def detokenizer(self, prompt_token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        """A fresh incremental detokenizer for one request's output."""
        ...


@runtime_checkable
class Sampler(Protocol):
    """Picks the next token for every sampling request of a step, on the whole batch at once."""

    def sample(self, logits: Any, chunks: Sequence[Any]) -> tuple[list[int], list[Any] | None]:
        """`logits` is a [n, vocab] float tensor, row i belonging to `chunks[i]` (ScheduledChunk).

        Returns the chosen token id of each row and, when any request asked for logprobs, a
        list with a `PositionLogprobs` (or None) per row. Reads each request's `params`
        and `all_token_ids` (penalties) and may keep state in `request.sampler_state`
        (a seeded generator). Runs in the runner's worker thread.

        Optional, for `params.prompt_logprobs`: `prompt_logprobs(logits, targets, num_top)` scores
        given tokens (row i: `targets[i]`) and returns (a `PositionLogprobs` per row, each token's
        rank); the built-in runner calls it on the prefill rows that score prompt tokens.

        Optional attribute `burst_safe` (bool, default False): True promises that a choice reads nothing of a
        request but its `params`, its `sampler_state` and, only for penalties, min_tokens and logits processors,
        its tokens; a runner may then run decode bursts (core/burst.py: several steps before the sampled tokens
        join their requests) for requests that use none of those three. A sampler without it never sees a burst.
        Optional attribute `greedy_argmax` (bool, default False): True promises that a greedy request's token is the
        index of the first maximum of its logits row, so a runner may choose it without calling `sample`.
        """
        ...


@runtime_checkable
class ModelRunner(Protocol):
    """Runs the model forward over one step's flattened batch and samples next tokens.

    Optional attribute `weight_bytes` (int): bytes of model weights the runner holds resident (quantized blocks
    counted as stored); /metrics reports it as `modelcall:model_weight_bytes` when present.

    Optional method `burst_steps(plan) -> int`: the most steps of a pure-decode `plan` one `execute` may run (decode
    bursts, core/burst.py). A runner that has it and answers K > 1 may be handed `plan.num_steps` up to K: it runs
    the plan's requests that many steps (or fewer), each step fed the tokens the last one sampled, and returns them
    all in `StepOutput.burst` with each step's end time in `burst_ts`. Without it, every plan is one step."""

    spec: ModelSpec

    def kv_block_bytes(self, block_size: int) -> int:
        """Bytes one KV block of `block_size` tokens takes across all layers (to size the pool)."""
        ...

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        """Preallocate the KV tensors for `num_blocks` blocks. Called once, before any step."""
        ...

    def execute(self, plan: SchedulePlan) -> StepOutput:
        """Compute every chunk of `plan` (write its K/V into the chunk's request's block table
        slots) and sample one token for each chunk with `sample=True`.

        Runs in a worker thread while the event loop goes on: it must not mutate requests
        (the kernel applies the output) nor touch the event loop.
        """
        ...

    def close(self) -> None:
        """Release device memory."""
        ...


@runtime_checkable
class KVCachePolicy(Protocol):
    """The paged KV block pool: which blocks a request holds, and which prefixes are cached.

    Plain Python; no tensors. Blocks are reference-counted; a block is free when its count is
    zero. With prefix caching, a full block is keyed by hash(parent hash, its token ids, extra
    keys) and keeps that key after being freed until it is reused (lazy eviction).
    """

    block_size: int
    num_blocks: int

    def match_prefix(self, request: Request) -> int:
        """Give `request` (holding no blocks yet) the longest run of cached full blocks that
        matches its known tokens, never covering its last prompt token. Returns the number of
        tokens covered (a multiple of block_size). Counts one query and its hits in `stats()`.
        """
        ...

    def allocate(self, request: Request, num_new_tokens: int) -> bool:
        """Grow `request.block_table` so `num_computed_tokens + num_new_tokens` tokens fit.
        Returns False, changing nothing, when there are not enough free blocks."""
        ...

    def commit(self, request: Request) -> None:
        """`request.num_computed_tokens` just advanced: key its newly full blocks for reuse."""
        ...

    def free(self, request: Request) -> None:
        """Release every block of `request` (cached ones stay findable until reused)."""
        ...

    def num_free_blocks(self) -> int:
        ...

    def stats(self) -> dict[str, float]:
        """At least: usage (0..1 of blocks held), queries, hits (in tokens), num_free_blocks."""
        ...

    def reset_prefix_cache(self) -> None:
        """Forget every cached key (blocks in use stay in use)."""
        ...

    # Optional, for n > 1 from one prefill: `fork(parent, child, num_tokens)` gives `child` (holding
    # no blocks) `parent`'s first `num_tokens` tokens of K/V (full blocks shared, the last partial one
    # copied on write) and returns the (source, destination) block copies the runner makes after
    # the step's forward, or None when it cannot. Without it, forks compute their prompt.
    # Optional, for KV tiers behind the pool: `prefetch(request)`, called by the scheduler when a request
    # arrives, starts reading the blocks of its prefix that only a slower tier holds (docs/kv-cache.md).


@runtime_checkable
class Scheduler(Protocol):
    """Decides, each step, which requests get how many of their uncomputed tokens.

    Owns the waiting and running queues. Must keep every scheduled request's KV blocks
    allocated (through the KV policy) for the tokens it schedules, preempting others by
    recompute when blocks run out. Plain Python; no torch, no I/O.
    """

    def add(self, request: Request) -> None:
        """Queue a newly admitted request."""
        ...

    def schedule(self) -> SchedulePlan:
        """Plan one step within the token budget and the running-sequence limit."""
        ...

    def finish(self, request: Request) -> None:
        """`request` ended (stop, length, abort, error): drop it and free its blocks."""
        ...

    def get(self, request_id: str) -> Request | None:
        ...

    @property
    def num_waiting(self) -> int:
        ...

    @property
    def num_running(self) -> int:
        ...

    def has_work(self) -> bool:
        ...
