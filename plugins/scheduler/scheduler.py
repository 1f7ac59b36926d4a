"""`DefaultScheduler`: one step's plan — running requests first (decodes and unfinished prefill chunks),
then waiting ones, within a token budget; preemption by recompute when KV blocks run out (and, under
the priority policy, when a more urgent request waits for blocks or a sequence slot).

Every request is computed tokens catching up with known tokens; a step grants each scheduled
request `min(uncomputed, budget left)` tokens, so long prompts are split across steps (chunked
prefill) and decodes are simply requests one token behind.
"""
from __future__ import annotations

from typing import Any

from modelcall.core.plan import ScheduledChunk, SchedulePlan
from modelcall.core.policies import WaitingQueue
from modelcall.core.request import Request, Status
from modelcall.core.stages import KVCachePolicy
from modelcall.plugins.scheduler.policy import make_waiting_queue, pick_victim


class _Step:
    """The plan being built: chunks by request id (a preempted request's chunk is taken back) and the budget."""

    __slots__ = ("budget", "chunks", "plan")

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.chunks: dict[str, ScheduledChunk] = {}
        self.plan = SchedulePlan()

    def add(self, request: Request, num_new_tokens: int) -> None:
        # NOTE: max_tokens 0 (scoring a prompt) computes the prompt and never samples.
        sample = request.num_computed_tokens + num_new_tokens == request.num_tokens and request.max_tokens > 0
        self.chunks[request.request_id] = ScheduledChunk(request, num_new_tokens, sample)
        self.budget -= num_new_tokens

    def add_draft(self, request: Request, draft: list[int]) -> None:
        """`request`'s last known token and `draft` after it, verified this step (speculative decoding)."""
        self.chunks[request.request_id] = ScheduledChunk(request, 1 + len(draft), True, draft=draft)
        self.budget -= 1 + len(draft)
        self.plan.num_draft_tokens += len(draft)

    def add_fork(self, child: Request, parent: Request) -> None:
        """`child` samples its first token from `parent`'s last row this step; it computes nothing."""
        self.chunks[child.request_id] = ScheduledChunk(child, 0, True, fork_of=parent)

    def take_back(self, request: Request) -> None:
        chunk = self.chunks.pop(request.request_id, None)
        if chunk is not None:
            self.budget += chunk.num_new_tokens
            if chunk.draft:
                self.plan.num_draft_tokens -= len(chunk.draft)

    def done(self) -> SchedulePlan:
        self.plan.chunks = list(self.chunks.values())
        return self.plan


class DefaultScheduler:
    """FCFS or priority continuous batching with chunked prefill over a `KVCachePolicy`.

    `watermark` is the fraction of all blocks kept free when admitting a new request while
    others run, so that running requests can grow a while before anyone is preempted.
    `waiting` is an empty `WaitingQueue` giving the admission order (default: the one `policy`
    names); `policy` still decides which running request is preempted.
    """

    def __init__(self, kv: KVCachePolicy, *, max_num_seqs: int = 256, max_num_batched_tokens: int = 2048,
                 policy: str = "fcfs", watermark: float = 0.01, waiting: WaitingQueue | None = None,
                 max_loras: int | None = None) -> None:
        self.kv = kv
        self.policy = policy
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.watermark_blocks = int(watermark * kv.num_blocks)
        self.waiting = waiting if waiting is not None else make_waiting_queue(policy)
        # Optional methods of a waiting queue (core/policies.py): told each step's plan, naming the victim.
        self._served = getattr(self.waiting, "served", None)
        self._victim_of = getattr(self.waiting, "victim", None)
        # The fast lane for newcomers (core/policies.py NewcomerTerms), when the queue offers one.
        terms = getattr(self.waiting, "newcomer_terms", None)
        self._newcomer = getattr(self.waiting, "newcomer", None) if terms is not None else None
        self.newcomer_step_tokens = terms.step_tokens if terms is not None else 0
        self.reserve_blocks = -(-terms.reserve_tokens // kv.block_size) if terms is not None else 0
        self.contended_chunk_tokens = terms.chunk_tokens if terms is not None else None
        self._contended = getattr(self.waiting, "contended", None) if self.contended_chunk_tokens else None
        self._lane_last_step = False   # the step after a fast-lane step is an ordinary one
        self.running: dict[str, Request] = {}  # in the order they were (re)admitted
        # n > 1: requests sharing a prompt with a request not yet past its prefill, by that request's
        # id; they are forked from its prefill (see _fork) rather than computing the prompt again.
        self.forks: dict[str, list[Request]] = {}
        # Requests told to expect forks (`num_forks`), held out of the waiting queue until every fork
        # was admitted, so that none misses the prefill it shares: id -> [request, forks still to come].
        self.held: dict[str, list] = {}
        # Speculative decoding (core/speculative.py), set by the kernel when configured: None is off.
        self.speculator: Any = None
        # LoRA: at most this many distinct adapters among the running requests (so in any step); None: no limit
        self.max_loras = max_loras

    # ---- the Scheduler protocol -------------------------------------------------------------

    def add(self, request: Request) -> None:
        request.status = Status.WAITING
        if request.num_forks > 0 and request.num_computed_tokens == 0 and not request.scheduled_once:
            self.held[request.request_id] = [request, request.num_forks]
            return
        parent = self.get(request.fork_of) if request.fork_of is not None else None
        if request.fork_of in self.held:
            self._fork_arrived(request.fork_of)
        if (parent is not None and parent.num_output_tokens == 0 and parent.max_tokens > 0
                and request.params.prompt_logprobs is None  # a fork computes no prompt rows to score
                and parent.num_prompt_tokens == request.num_prompt_tokens
                and parent.prompt_token_ids == request.prompt_token_ids):
            self.forks.setdefault(parent.request_id, []).append(request)
            return
        self.waiting.push(request)
        prefetch = getattr(self.kv, "prefetch", None)   # optional (KV tiers): read its prefix back before it runs
        if prefetch is not None and not request.scheduled_once:
            prefetch(request)

    def schedule(self) -> SchedulePlan:
        budget = self.max_num_batched_tokens
        if self._contended is not None and self._contended():  # short steps while the batch is shared
            budget = min(budget, self.contended_chunk_tokens + len(self.running))
        step = _Step(budget)
        lane = self._admit_newcomers(step)
        if lane:  # the newcomers are in: the others add at most step_tokens to this step
            step.budget = min(step.budget, self.newcomer_step_tokens)
        self._schedule_running(step)
        # NOTE: after a preemption blocks are short; admitting new work now would only thrash.
        if not step.plan.preempted:
            self._schedule_waiting(step)
        if self.forks:
            self._fork(step)
        plan = step.done()
        if self._served is not None:
            self._served(plan)
        return plan

    def finish(self, request: Request) -> None:
        if (self.running.pop(request.request_id, None) is None and not self.waiting.remove(request)
                and self.held.pop(request.request_id, None) is None):
            self._drop_fork(request)
        for child in self.forks.pop(request.request_id, ()):  # never forked: they compute the prompt themselves
            self.waiting.push(child)
        self.kv.free(request)

    def get(self, request_id: str) -> Request | None:
        found = self.running.get(request_id) or self.waiting.get(request_id)
        if found is None and request_id in self.held:
            found = self.held[request_id][0]
        if found is None and self.forks:
            found = next((c for cs in self.forks.values() for c in cs if c.request_id == request_id), None)
        return found

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.held) + sum(len(cs) for cs in self.forks.values())

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_work(self) -> bool:
        return bool(self.running) or bool(self.waiting)

    # ---- forks (n > 1) ------------------------------------------------------------------------

    def _fork(self, step: _Step) -> None:
        """Each request whose prompt ends this step hands its held forks its K/V: full blocks shared,
        the last partial one copied after the forward; each fork samples its own first token from
        the same last row. A fork that finds no running slot or block computes the prompt itself."""
        fork = getattr(self.kv, "fork", None)
        for chunk in list(step.chunks.values()):
            parent = chunk.request
            if not chunk.sample or parent.num_output_tokens or parent.request_id not in self.forks:
                continue
            for child in self.forks.pop(parent.request_id):
                copies = (fork(parent, child, parent.num_prompt_tokens)
                          if fork is not None and len(self.running) < self.max_num_seqs else None)
                if copies is None:
                    self.waiting.push(child)
                    continue
                step.plan.block_copies.extend(copies)
                child.num_computed_tokens = parent.num_prompt_tokens
                child.status = Status.RUNNING
                self.running[child.request_id] = child
                if not child.scheduled_once:
                    child.scheduled_once = True
                    step.plan.newly_scheduled.append(child)
                step.add_fork(child, parent)

    def _fork_arrived(self, parent_id: str) -> None:
        entry = self.held[parent_id]
        entry[1] -= 1
        if entry[1] <= 0:  # every fork is here: the shared prefill can start
            del self.held[parent_id]
            self.waiting.push(entry[0])

    def _drop_fork(self, request: Request) -> None:
        for parent_id, children in list(self.forks.items()):
            if request in children:
                children.remove(request)
                if not children:
                    del self.forks[parent_id]
                return

    # ---- the fast lane for newcomers (a waiting queue's NewcomerTerms) -------------------------

    def _admit_newcomers(self, step: _Step) -> bool:
        """Admit the newcomers at the head of the queue first; True when any was (a fast-lane step).
        Not two such steps in a row, so the running requests advance at least every other step."""
        lane = False
        if self._newcomer is not None and not self._lane_last_step:
            while self.waiting and step.budget > 0 and len(self.running) < self.max_num_seqs:
                head = self.waiting.peek()
                if not (self._newcomer(head) and self._lora_fits(head) and self._admit(head, step)):
                    break
                lane = True
        self._lane_last_step = lane
        return lane

    # ---- running requests -------------------------------------------------------------------

    def _schedule_running(self, step: _Step) -> None:
        speculator = self.speculator   # None: off, or no drafts in a batch this large (disable_by_batch_size)
        if speculator is not None and not speculator.active(len(self.running)):
            speculator = None
        for request in list(self.running.values()):
            if step.budget <= 0:
                break
            if request.request_id not in self.running or request.request_id in step.chunks:
                continue  # preempted earlier in this step, or a newcomer admitted first
            num_new = min(request.num_uncomputed_tokens, step.budget)
            if num_new == 1 and speculator is not None and request.num_output_tokens:
                draft = speculator.draft(request, step.budget - 1)
                # NOTE: drafts only take free blocks (never preempt for a guess); short of them, decode plainly.
                if draft and self.kv.allocate(request, 1 + len(draft)):
                    step.add_draft(request, draft)
                    continue
            if num_new > 0 and self._allocate_or_preempt(request, num_new, step):
                step.add(request, num_new)

    def _allocate_or_preempt(self, request: Request, num_new: int, step: _Step) -> bool:
        """Grow `request`'s blocks, preempting victims until they fit; False when it was the victim."""
        while not self.kv.allocate(request, num_new):
            victim = self._victim()
            self._preempt(victim, step)
            if victim is request:
                return False
        return True

    def _victim(self) -> Request:
        """The running request to preempt: the waiting queue's choice when it makes one, else the policy's."""
        return self._victim_of(self.running) if self._victim_of is not None else pick_victim(self.policy, self.running)

    def _preempt(self, request: Request, step: _Step) -> None:
        """Recompute later: drop its blocks (its cached full blocks stay findable) and requeue it."""
        step.take_back(request)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.status = Status.PREEMPTED
        request.num_preemptions += 1
        del self.running[request.request_id]
        self.waiting.push_front(request)
        step.plan.preempted.append(request)

    # ---- waiting requests -------------------------------------------------------------------

    def _schedule_waiting(self, step: _Step) -> None:
        while self.waiting and step.budget > 0:
            head = self.waiting.peek()
            if len(self.running) < self.max_num_seqs and self._lora_fits(head) and self._admit(head, step):
                continue
            if not self._preempt_for(head, step):
                break  # head-of-line: later requests wait their turn too

    def _preempt_for(self, head: Request, step: _Step) -> bool:
        """Priority (and fair, which is priority first): make room for a waiting request more urgent
        than the least urgent running one. Fair compares priority alone: within a level its order is
        the tenants' counters, so a victim of the same level could be requeued ahead of `head`, and
        the two would preempt each other forever."""
        if self.policy not in ("priority", "fair") or not self.running:
            return False
        victim = self._victim()
        if self.policy == "fair":
            if victim.priority <= head.priority:
                return False
        elif (victim.priority, victim.arrival) <= (head.priority, head.arrival):
            return False
        self._preempt(victim, step)
        return True

    def _lora_fits(self, request: Request) -> bool:
        """Whether `request`'s adapter may run now: the base model, an adapter already running, or a free adapter slot
        (max_loras). NOTE: head of line, like a short KV pool: the head waits until a running adapter's requests end."""
        if request.lora is None or self.max_loras is None:
            return True
        running = {r.lora.key for r in self.running.values() if r.lora is not None}
        return request.lora.key in running or len(running) < self.max_loras

    def _admit(self, request: Request, step: _Step) -> bool:
        # NOTE: a chunk always needs at least one new block (a prefix hit is whole blocks and never
        # the last token); checking that first keeps a blocked head from querying the cache per step.
        keep = self.watermark_blocks + self._reserve_against(request)
        if self.running and self.kv.num_free_blocks() < 1 + keep:
            return False
        # A waiting request holds no blocks (new, preempted, or undone below); preempted ones
        # re-match their own freed blocks, output tokens included.
        # NOTE: a prefix hit would skip rows whose prompt logprobs were asked: those requests compute
        # the prompt (what a preemption already scored is not scored again, see the runner).
        # So would a hit for a pooling request that reads every token's state (mean, CLS).
        num_hit = 0 if request.wants_prompt_logprobs or request.pools_every_token else self.kv.match_prefix(request)
        request.num_computed_tokens = num_hit
        num_new = min(request.num_uncomputed_tokens, step.budget)
        if not self._fits(request, num_new, keep):
            self.kv.free(request)
            request.num_computed_tokens = 0
            return False
        self.waiting.pop()
        self.running[request.request_id] = request
        request.status = Status.RUNNING
        if not request.scheduled_once:
            request.scheduled_once = True
            request.num_cached_tokens = num_hit
            step.plan.newly_scheduled.append(request)
        step.add(request, num_new)
        return True

    def _reserve_against(self, request: Request) -> int:
        """The blocks held back for newcomers that `request` may not take (0 for a newcomer)."""
        if not self.reserve_blocks or self._newcomer is None or self._newcomer(request):
            return 0
        return self.reserve_blocks

    def _fits(self, request: Request, num_new: int, keep: int) -> bool:
        """Allocate for a new chunk, keeping `keep` blocks free unless nothing else is running. Under a
        newcomer reserve the whole prompt is counted, not its first chunk: the later chunks of the
        requests admitted must not grow into the reserve."""
        if self.running:
            block_size = self.kv.block_size
            upto = request.num_computed_tokens + num_new
            if keep > self.watermark_blocks:
                upto = max(upto, request.num_prompt_tokens)
            needed = -(-upto // block_size) - len(request.block_table)
            if self.kv.num_free_blocks() - needed < keep:
                return False
        return self.kv.allocate(request, num_new)
