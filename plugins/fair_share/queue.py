"""`FairQueue`: the waiting queue of `--scheduling fair`. Priority first; within the most urgent
priority level waiting, the tenant with the least virtual token counter; within a tenant, arrival
order (a preempted request goes back to the front of its tenant's line).

The built-in scheduler tells it each step's plan (`served`), from which it charges the tokens
each tenant is served: a request's prompt when it is admitted (once: a recompute after
preemption is the engine's doing, not the tenant's), its output tokens as they are generated.
When blocks run out it names the victim (`victim`): the least urgent running request of the
tenant that has been served the most.

A newcomer (`newcomer`: a request of a tenant with nothing running) gets the scheduler's fast lane
(`newcomer_terms`, core/policies.py): it is admitted before the running requests are scheduled, in
a step they add at most `step_tokens` to, and the other tenants' requests leave `reserve_tokens` of
KV room free for it. Counters decide who is next; the lane decides how soon that next one's first
token comes: without it a light tenant's request shares its step with a heavy tenant's prefill
chunk and may find every block taken by the heavy tenant's prompts.

Which tenant a request belongs to (and its weight) the queue learns at admission, from the meter
`TenantTags` (plugin.py), which sees each request's caller; a request without one is the tenant "".

`peek` is O(tenants waiting in the most urgent level); every other method O(1) but `__iter__`.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

from modelcall.core.plan import SchedulePlan
from modelcall.core.policies import NewcomerTerms
from modelcall.core.request import Request
from modelcall.plugins.fair_share.counters import VirtualTokenCounter

Line = OrderedDict[str, Request]  # one tenant's waiting requests at one priority, in admission order


class _Served:
    """A request admitted at least once: its tenant, weight and what has been charged for it."""

    __slots__ = ("request", "tenant", "weight", "prompt", "output", "running")

    def __init__(self, request: Request, tenant: str, weight: float) -> None:
        self.request, self.tenant, self.weight = request, tenant, weight
        self.prompt = 0
        self.output = 0
        self.running = False   # admitted to the batch and not preempted or finished since


class FairQueue:
    """A `modelcall.core.WaitingQueue` by least virtual token counter within each priority level."""

    def __init__(self, counter: VirtualTokenCounter | None = None, newcomer_terms: NewcomerTerms | None = None,
                 active_window_s: float = 5.0) -> None:
        self.vtc = counter or VirtualTokenCounter()
        self.newcomer_terms = newcomer_terms                 # None: no fast lane (the scheduler reads it once)
        self.active_window_s = active_window_s
        self._seen: OrderedDict[str, float] = OrderedDict()  # tenant -> when it last sent or was served, oldest first
        self._running_of: dict[str, int] = {}                # tenant -> its requests in the running batch
        self._levels: dict[int, dict[str, Line]] = {}        # priority -> tenant -> line
        self._where: dict[str, tuple[int, str]] = {}         # waiting request id -> (priority, tenant)
        self._waiting_of: dict[str, int] = {}                # tenant -> its waiting requests, all levels
        self._tags: dict[str, tuple[str, float]] = {}        # request id -> (tenant, weight), set at admission
        self._served: dict[str, _Served] = {}                # request id -> charges, from first admission to end

    # ---- what the meter tells (plugin.py) ---------------------------------------------------

    def tag(self, request_id: str, tenant: str, weight: float) -> None:
        self._tags[request_id] = (tenant, weight)

    def finished(self, request_id: str) -> None:
        """The request ended: charge its last output tokens and forget it."""
        self._tags.pop(request_id, None)
        served = self._served.pop(request_id, None)
        if served is not None:
            self._charge_output(served)
            self._set_running(served, False)

    # ---- the WaitingQueue protocol ------------------------------------------------------------

    def push(self, request: Request) -> None:
        tenant = self._tenant_of(request)
        if not self._waiting_of.get(tenant):  # it becomes backlogged: no banked idleness
            self.vtc.lift(tenant, (t for t, n in self._waiting_of.items() if n))
        self._line(request.priority, tenant)[request.request_id] = request
        self._enter(request, tenant)
        self._saw(tenant, time.monotonic())

    def push_front(self, request: Request) -> None:
        served = self._served.get(request.request_id)
        if served is not None:   # preempted: out of the batch
            self._set_running(served, False)
        tenant = self._tenant_of(request)
        line = self._line(request.priority, tenant)
        line[request.request_id] = request
        line.move_to_end(request.request_id, last=False)
        self._enter(request, tenant)

    def peek(self) -> Request:
        tenants = self._levels[min(self._levels)]
        counters, waiting = self.vtc.counters, self._waiting_of
        # NOTE: a tenant just lifted ties with the least counter; ties go to the tenant with fewer requests
        # waiting (the one that just arrived, not the backlog), then to the earlier head arrival.
        tenant = min(tenants, key=lambda t: (counters.get(t, 0.0), waiting[t], next(iter(tenants[t].values())).arrival))
        return next(iter(tenants[tenant].values()))

    def pop(self) -> Request:
        request = self.peek()
        self._leave(request)
        served = self._served.get(request.request_id)
        if served is None:
            tenant, weight = self._tags.pop(request.request_id, ("", 1.0))
            served = self._served[request.request_id] = _Served(request, tenant, weight)
        if served.prompt < request.num_prompt_tokens:  # VTC charges the prompt when the request joins the batch
            self.vtc.charge(served.tenant, served.weight, prompt_tokens=request.num_prompt_tokens - served.prompt)
            served.prompt = request.num_prompt_tokens
        self._set_running(served, True)
        return request

    def remove(self, request: Request) -> bool:
        if request.request_id not in self._where:
            return False
        self._leave(request)
        return True

    def get(self, request_id: str) -> Request | None:
        where = self._where.get(request_id)
        return self._levels[where[0]][where[1]][request_id] if where else None

    def __len__(self) -> int:
        return len(self._where)

    def __iter__(self) -> Iterator[Request]:
        """A snapshot in the order they would be admitted if the counters stood still."""
        out: list[Request] = []
        for priority in sorted(self._levels):
            tenants = self._levels[priority]
            for tenant in sorted(tenants, key=lambda t: self.vtc[t]):
                out.extend(tenants[tenant].values())
        return iter(out)

    # ---- what the scheduler tells (optional methods of a waiting queue) -----------------------

    def served(self, plan: SchedulePlan) -> None:
        """Charge the output tokens generated since the last step by the requests of this one."""
        served_of = self._served
        t = time.monotonic()
        for chunk in plan.chunks:
            served = served_of.get(chunk.request.request_id)
            if served is not None:
                self._charge_output(served)
                self._saw(served.tenant, t)

    def contended(self) -> bool:
        """Whether more than one tenant sent or was served within the last `active_window_s` (then the
        scheduler keeps steps short: NewcomerTerms.chunk_tokens). O(1) but for the tenants gone quiet."""
        horizon, seen = time.monotonic() - self.active_window_s, self._seen
        while seen and next(iter(seen.values())) < horizon:
            seen.popitem(last=False)
        return len(seen) > 1

    def newcomer(self, request: Request) -> bool:
        """Whether nothing of `request`'s tenant is running: it gets the fast lane (NewcomerTerms)."""
        return not self._running_of.get(self._tenant_of(request))

    def victim(self, running: Mapping[str, Request]) -> Request:
        """The running request to preempt: least urgent priority, then the tenant served the most,
        then the latest arrival."""
        def rank(r: Request) -> tuple[int, float, float]:
            served = self._served.get(r.request_id)
            return r.priority, self.vtc[served.tenant] if served else 0.0, r.arrival
        return max(running.values(), key=rank)

    # ---- internals ------------------------------------------------------------------------------

    def _tenant_of(self, request: Request) -> str:
        served = self._served.get(request.request_id)
        if served is not None:
            return served.tenant
        tag = self._tags.get(request.request_id)
        return tag[0] if tag else ""

    def _line(self, priority: int, tenant: str) -> Line:
        tenants = self._levels.setdefault(priority, {})
        line = tenants.get(tenant)
        if line is None:
            line = tenants[tenant] = OrderedDict()
        return line

    def _enter(self, request: Request, tenant: str) -> None:
        self._where[request.request_id] = (request.priority, tenant)
        self._waiting_of[tenant] = self._waiting_of.get(tenant, 0) + 1

    def _leave(self, request: Request) -> None:
        priority, tenant = self._where.pop(request.request_id)
        tenants = self._levels[priority]
        line = tenants[tenant]
        del line[request.request_id]
        if not line:
            del tenants[tenant]
            if not tenants:
                del self._levels[priority]
        self._waiting_of[tenant] -= 1

    def _saw(self, tenant: str, t: float) -> None:
        self._seen[tenant] = t
        self._seen.move_to_end(tenant)

    def _set_running(self, served: _Served, running: bool) -> None:
        if served.running != running:
            served.running = running
            self._running_of[served.tenant] = self._running_of.get(served.tenant, 0) + (1 if running else -1)

    def _charge_output(self, served: _Served) -> None:
        produced = served.request.num_output_tokens
        if produced > served.output:
            self.vtc.charge(served.tenant, served.weight, output_tokens=produced - served.output)
            served.output = produced

    def stats(self) -> dict[str, Any]:
        """The counters and what waits, per tenant (for tests and benchmarks)."""
        return {"counters": dict(self.vtc.counters), "waiting": {t: n for t, n in self._waiting_of.items() if n}}
