"""Decode bursts: one decode plan run for several steps in one `execute` (vLLM's multi-step scheduling,
`--num-scheduler-steps`).

Why: at batch 1 a CPU decode step of a small model takes a few milliseconds, and the engine's own work between
two forwards (schedule, apply, publish, the worker thread's hand-off, each consumer's wake-up) is a tenth of
it on the same core. A burst hands the runner the same decode plan for K steps; it feeds each step's sampled
tokens to the next and returns every step's tokens with the time each step ended. The engine then applies
them token by token through each request's output stage, exactly as K single steps would have, with the
tokens' own times (`Engine._apply_burst`).

    plan (decode, K = 4) --execute--> [t1 a1] [t2 a2] [t3 a3] [t4 a4]   tokens of requests t and a, per step
                                      apply step 1, 2, 3, 4: a stop in step 2 ends `a`; a3, a4 dropped unseen

A request its output stage ends mid-burst (EOS, a stop string, a tool call's end) keeps nothing of its later
steps: their tokens are never appended, and the K/V they wrote lies past the request's end in blocks its end
frees. A burst is only asked for when its K steps compute what K single steps would:

* pure decode: one new token a request, sampled; no drafts, forks or block copies, no prompt logprobs;
* nothing the burst leaves stale feeds the sampler: no logits processors, penalties or logprobs, and any
  `min_tokens` already met (a burst's own tokens join the requests only when it is applied);
* nobody is kept waiting: no arrivals, aborts or queued requests (they would wait out the burst);
* at most the tokens every request has left (max_tokens, the context window), with blocks for all of them
  free now: a burst never preempts.

K is the most steps that fit `budget_s` at the last decode step's measured time (clients see tokens in bursts
of about that long at most, new arrivals wait at most that long), capped by `max_steps` and by the runner
(`ModelRunner.burst_steps`).
"""
from __future__ import annotations

from typing import Any

from modelcall.core.plan import SchedulePlan
from modelcall.core.request import Request


def burst_safe(request: Request) -> bool:
    """`request`'s next tokens depend on none of the tokens a burst samples before it is applied."""
    p = request.params
    return (not request.logits_processors and p.logprobs is None and p.prompt_logprobs is None
            and p.repetition_penalty == 1.0 and not p.presence_penalty and not p.frequency_penalty
            and request.num_output_tokens >= p.min_tokens)


class BurstPolicy:
    """How many steps the next decode plan may run in one execute (1: a single step)."""

    def __init__(self, max_steps: int, budget_s: float) -> None:
        self.max_steps = max_steps
        self.budget_s = budget_s
        self.step_s = 0.0   # the last decode step's forward time (0: none measured yet)

    def observe(self, plan: SchedulePlan, forward_s: float, steps: int) -> None:
        """A decode plan's forward took `forward_s` for `steps` steps: the next burst is sized by it."""
        if steps and all(c.num_new_tokens == 1 for c in plan.chunks):
            self.step_s = forward_s / steps

    def steps_for(self, plan: SchedulePlan, window: int, runner: Any, kv: Any, waiting: bool) -> int:
        """The steps `plan` may run, its requests' blocks grown for them (1 when it must run one step)."""
        if self.max_steps <= 1 or waiting or not self.step_s or not plan.chunks:
            return 1
        if plan.num_draft_tokens or plan.block_copies or plan.preempted or plan.newly_scheduled:
            return 1
        # the runner's answer first: where it never bursts (a model with sliding-window groups, adapter rows) the step
        # pays no walk over its requests
        limit = getattr(runner, "burst_steps", None)
        k = min(self.max_steps, int(self.budget_s / self.step_s), limit(plan) if limit is not None else 1)
        if k <= 1:
            return 1
        for c in plan.chunks:
            req = c.request
            if c.num_new_tokens != 1 or not c.sample or c.fork_of is not None or not burst_safe(req):
                return 1
            # NOTE: the last step samples token num_tokens + k - 1; it must stay inside both limits
            k = min(k, req.max_tokens - req.num_output_tokens, window - req.num_tokens)
            if k <= 1:
                return 1
        # NOTE: blocks only from the free pool (allocate never preempts); one request short of them and the plan
        # runs one step (the blocks already grown are the ones its next steps take anyway)
        if not all(kv.allocate(c.request, k) for c in plan.chunks):
            return 1
        return k
