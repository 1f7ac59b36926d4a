"""Speculative decoding: cheap proposers guess the next tokens, one forward verifies them.

    known:     [ ... t ]          a decoding request, one token (t) not yet computed
    proposed:  [ ... t | d1 d2 d3 ]   the scheduler grants 1 + k tokens; the runner computes logits
                                       at those k + 1 rows; the sampler keeps the longest prefix
    accepted:  [ ... t d1 d2 | c ]    d1, d2 matched (greedy) or survived rejection sampling, c is the
                                       correction (or bonus) token; the K/V of d3 is rolled back

Speculation is off unless `KernelConfig.speculative_config` is set (vLLM's JSON:
`{"method": "ngram" | "suffix", "num_speculative_tokens": k, "prompt_lookup_max", "prompt_lookup_min"}`).
A proposer is a plugin (`provide_proposer`); the `Speculator` here holds one and decides, per
request, whether to ask it (eligibility, adaptive back-off) and how many tokens to allow.

Text that never repeats must cost (almost) nothing: a step in which no request drafted is the plain
step (the runner and engine branch on `SchedulePlan.num_draft_tokens` / `StepOutput.spec_tokens`),
and a request whose proposer keeps finding nothing is asked after 1, 2, 4 ... 16 steps, not every
step (`max_idle_steps`), its index catching up then (`plugins/speculative/index.py`).

Requests never speculated: logits processors (grammar-constrained decoding, which would need the
mask at every drafted row), penalties, min_tokens not reached yet, or logprobs asked (the
verification path computes none). Their tokens are sampled exactly as without speculation.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import msgspec

from modelcall.core.errors import ConfigError

METHODS = ("ngram", "suffix")
STATE = "spec"  # request.extra key of the per-request _State


class SpeculativeConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's `--speculative-config` fields that modelcall implements (n-gram and suffix methods)."""

    method: str
    num_speculative_tokens: int = 5
    prompt_lookup_max: int = 4
    # NOTE: 2, not 1: a one-token match is chance on text that does not repeat (W1 drafted 330 tokens,
    # 0 accepted, at 1), and each draft costs its request k extra rows in the step's forward.
    prompt_lookup_min: int = 2
    # Adaptive back-off: after `min_drafts` drafts, a request whose acceptance (an exponential average,
    # halving, of each draft's accepted fraction) is below `min_acceptance` stops proposing for
    # `backoff_steps` steps (doubled each time it fails again), then tries again.
    min_acceptance: float = 0.3
    min_drafts: int = 1
    backoff_steps: int = 16
    # A miss costs the proposer's lookup: a request whose proposer finds nothing is asked again after
    # 1, 2, 4, ... steps, at most `max_idle_steps` (a draft resets it), so text that never repeats costs
    # about one lookup per request per `max_idle_steps` steps.
    max_idle_steps: int = 16
    # vLLM's: no drafts in a step whose batch holds more than this many running requests (verification
    # rows cost compute that a large batch has no spare of); None: any batch size.
    disable_by_batch_size: int | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"speculative_config method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if not 1 <= self.num_speculative_tokens <= 64:
            raise ConfigError(f"num_speculative_tokens must be in 1..64, got {self.num_speculative_tokens}")
        if self.disable_by_batch_size is not None and self.disable_by_batch_size < 1:
            raise ConfigError(f"disable_by_batch_size must be >= 1, got {self.disable_by_batch_size}")
        if self.max_idle_steps < 0:
            raise ConfigError(f"max_idle_steps must be >= 0, got {self.max_idle_steps}")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ConfigError("prompt_lookup_min must be >= 1 and <= prompt_lookup_max, got "
                              f"{self.prompt_lookup_min} and {self.prompt_lookup_max}")


def parse_config(raw: Any) -> SpeculativeConfig | None:
    """A `SpeculativeConfig` from a dict or JSON text (None, "" or {}: speculation off)."""
    if raw is None or raw == "" or raw == {}:
        return None
    if isinstance(raw, SpeculativeConfig):
        return raw
    try:
        if isinstance(raw, (str, bytes)):
            return msgspec.json.decode(raw, type=SpeculativeConfig)
        return msgspec.convert(raw, SpeculativeConfig)
    except msgspec.ValidationError as e:
        raise ConfigError(f"speculative_config: {e}") from e
    except msgspec.DecodeError as e:
        raise ConfigError(f"speculative_config is not JSON: {e}") from e


@runtime_checkable
class Proposer(Protocol):
    """Guesses the tokens that follow a request's known tokens. Called on the engine loop, once per
    step per decoding request that may speculate: it must be fast (no model forward, no I/O)."""

    def propose(self, request: Any, k: int) -> list[int]:
        """Up to `k` token ids likely to follow `request.all_token_ids` (may be empty: no guess).
        Must not change the request's tokens; may keep its own state in `request.extra`."""
        ...

    def finished(self, request: Any) -> None:
        """`request` ended (any reason): a proposer that learns across requests may keep its tokens;
        it must drop whatever it keeps in the request itself. May do nothing."""
        ...


class _State:
    __slots__ = ("drafts", "drafted", "accepted", "rate", "resume_at", "backoff", "steps", "k", "idle",
                 "sampling_ok")

    def __init__(self, backoff: int, k: int, sampling_ok: bool) -> None:
        # Draft length: starts short (a first guess that misses costs little), doubles while whole drafts
        # are accepted, falls to one more than what was accepted on a miss.
        self.k = k
        self.drafts = 0         # drafts verified so far
        self.drafted = 0        # draft tokens verified so far
        self.accepted = 0       # of which accepted
        # Exponential average of each draft's accepted fraction; a new request starts at 0.5, so a first
        # draft that misses entirely already backs it off (a workload that never repeats pays little).
        self.rate = 0.5
        self.resume_at = 0      # steps (of this request) before it proposes again
        self.backoff = backoff
        self.steps = 0          # decode steps seen
        self.idle = 1           # steps skipped after the next empty proposal (doubles per miss in a row)
        self.sampling_ok = sampling_ok   # its sampling parameters allow exact verification (fixed)


class Speculator:
    """Asks `proposer` for drafts of eligible requests and keeps each request's acceptance.

    Engine-loop only (never the runner's thread). `num_draft_tokens`, `num_accepted_tokens` and
    `accepted_by_position` are totals since start (vLLM's spec_decode counters)."""

    def __init__(self, config: SpeculativeConfig, proposer: Proposer) -> None:
        self.config = config
        self.proposer = proposer
        self.k = config.num_speculative_tokens
        self.num_drafts = 0
        self.num_proposer_calls = 0   # not a vLLM counter: how often a miss was paid for
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_by_position = [0] * self.k

    def active(self, num_running: int) -> bool:
        """Whether a step with `num_running` running requests may hold drafts at all (asked once per step)."""
        limit = self.config.disable_by_batch_size
        return limit is None or num_running <= limit

    @staticmethod
    def eligible(request: Any) -> bool:
        """Whether `request`'s next tokens can be verified exactly by the speculative path."""
        return (Speculator._sampling_ok(request.params) and not request.logits_processors
                and request.num_output_tokens >= request.params.min_tokens)

    @staticmethod
    def _sampling_ok(p: Any) -> bool:
        return (p.logprobs is None and p.repetition_penalty == 1.0 and p.presence_penalty == 0.0
                and p.frequency_penalty == 0.0)

    def draft(self, request: Any, max_tokens: int) -> list[int]:
        """Draft tokens for a decoding `request` this step (at most `max_tokens`), or []."""
        # NOTE: called per decoding request per step: the common cases (backing off, idle after misses)
        # return before anything else is read.
        state = request.extra.get(STATE)
        if state is None:
            state = request.extra[STATE] = _State(self.config.backoff_steps, min(2, self.k),
                                                  self._sampling_ok(request.params))
        state.steps += 1
        if state.resume_at > state.steps:
            return []
        if not state.sampling_ok or request.logits_processors:
            return []
        num_output = request.num_output_tokens
        k = min(state.k, max_tokens, request.max_tokens - num_output - 1)
        if k <= 0 or num_output < request.params.min_tokens:
            return []
        self.num_proposer_calls += 1
        draft = self.proposer.propose(request, k)
        if not draft:   # nothing found: ask again after 1, 2, 4, ... steps
            cap = self.config.max_idle_steps
            state.resume_at = state.steps + 1 + min(state.idle, cap)
            state.idle = min(2 * state.idle, cap)
            return draft
        state.idle = 1
        return draft[:k]

    def verified(self, request: Any, num_draft: int, num_accepted: int) -> None:
        """Record one verification of `request`: `num_accepted` of `num_draft` drafts kept."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft
        self.num_accepted_tokens += num_accepted
        for j in range(num_accepted):
            self.accepted_by_position[j] += 1
        state = request.extra.get(STATE)
        if state is None:
            return
        state.drafts += 1
        state.drafted += num_draft
        state.accepted += num_accepted
        state.k = min(2 * state.k, self.k) if num_accepted == num_draft else max(1, num_accepted + 1)
        state.rate = 0.5 * state.rate + 0.5 * num_accepted / num_draft
        c = self.config
        if state.drafts >= c.min_drafts and state.rate < c.min_acceptance:
            state.resume_at = state.steps + state.backoff
            state.backoff *= 2
            state.rate = c.min_acceptance  # a fresh chance when it resumes

    def finished(self, request: Any) -> None:
        self.proposer.finished(request)

    @staticmethod
    def acceptance(request: Any) -> tuple[int, int]:
        """(draft tokens, accepted tokens) of `request` so far; (0, 0) when it never speculated."""
        state = request.extra.get(STATE)
        return (state.drafted, state.accepted) if state is not None else (0, 0)


def assemble(host: Any, config: Any) -> Speculator | None:
    """The kernel's `Speculator` for `config.speculative_config`, or None when speculation is off."""
    spec = parse_config(getattr(config, "speculative_config", None))
    if spec is None:
        return None
    proposer = host.pm.hook.provide_proposer(config=config, spec_config=spec)
    if proposer is None:
        raise ConfigError(f"no plugin provides the speculative method {spec.method!r}")
    return Speculator(spec, proposer)
