"""The engine loop, one task and no task per token, in the order of docs' diagram:

    admit → schedule → prefill / decode (+ sample, off the event loop) → apply → publish

`apply` (a forward's output joining its requests, through each one's output stage) is core/step_apply.py's
StepApplier, a base of Engine; the rest of the loop is here.

With `async_scheduling` (vLLM's name) the loop holds each step after its apply and publishes it (its
output stage: detokenize, stops, parsers, filters; then its events) once the next step's forward has
started, so post-processing step N overlaps the forward of step N+1 (see `Engine._step`).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import anyio

from modelcall.core.burst import BurstPolicy
from modelcall.core.forward import ForwardWorker
from modelcall.core.plan import SchedulePlan, StepOutput
from modelcall.core.pooling import Pooler
from modelcall.core.record import RequestRecord
from modelcall.core.request import Status
from modelcall.core.stages import KVCachePolicy, ModelRunner, Scheduler
from modelcall.core.step_apply import PendingToken, StepApplier
from modelcall.events import EventBus, Preempted, RequestScheduled, StepDone, now

log = logging.getLogger("modelcall.engine")


class HeldStep:
    """A step applied but not yet published: the tokens whose output stage is still to run (async
    scheduling only), its events so far, its StepDone and its time."""

    __slots__ = ("todo", "events", "done", "t")

    def __init__(self, todo: list[PendingToken], events: list, done: StepDone, t: float) -> None:
        self.todo, self.events, self.done, self.t = todo, events, done, t

    @property
    def feeds_sampler(self) -> bool:
        """A held token's request has logits processors (see `Engine._admit`)."""
        return any(rec.request.logits_processors for rec, _, _ in self.todo)


class Engine(StepApplier):
    """Owns the step loop. Requests enter through `add`, leave through `abort` or their stop."""

    def __init__(self, scheduler: Scheduler, runner: ModelRunner, kv: KVCachePolicy, bus: EventBus,
                 window: int, consumer_timeout_s: float = 60.0) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.kv = kv
        self.bus = bus
        self.window = window
        self.consumer_timeout_s = consumer_timeout_s
        self.records: dict[str, RequestRecord] = {}
        self._inbox: list[RequestRecord] = []
        self._aborts: dict[str, str] = {}  # request id -> finish reason
        self._wake = anyio.Event()
        self._stopping = False
        self.alive = False
        self.step_count = 0
        self._stale_checked = 0   # step_count at the last look for stale streams
        self.last_error: str | None = None
        self.forwards = ForwardWorker(runner, scheduler)   # the worker thread and the blocks a forward may read
        # Speculative decoding (core/speculative.py), set by the kernel when configured: None is off.
        self.speculator: Any = None
        # The model's pooling stage (core/pooling.py), set by the kernel: None when it pools nothing.
        self.pooler: Pooler | None = None
        # Post-process step N while step N+1's forward runs (set by the kernel from its config); the
        # loop reads it once, when it starts (`_overlap`: on, and the event loop is asyncio).
        self.async_scheduling = False
        self._overlap = False
        # Decode bursts (core/burst.py), set by the kernel from its config: None is off.
        self.bursts: BurstPolicy | None = None

    # ---- entry from other tasks (same event loop) ---------------------------------------

    def add(self, record: RequestRecord) -> None:
        self._inbox.append(record)
        self._wake.set()

    def abort(self, request_id: str, reason: str = "abort") -> None:
        """End a request after the current step (its blocks may be in use by the forward now)."""
        self._aborts.setdefault(request_id, reason)
        self._wake.set()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    @property
    def num_pending(self) -> int:
        """Admitted requests not yet handed to the scheduler (they arrived while a step ran)."""
        return len(self._inbox)

    @property
    def num_unfinished(self) -> int:
        return len(self.records) + len(self._inbox)

    # ---- the loop: admit → schedule → prefill / decode (+ sample) → apply → publish -----

    async def run(self) -> None:
        """Steps until stopped. With async scheduling (`_overlap`), step N is *held* after its apply:
        its output stage runs and its events go out once step N+1's forward has started."""
        self.alive = True
        self._overlap = self._overlap_ok()
        held: HeldStep | None = None
        try:
            while not self._stopping:
                held = self._admit(held)
                if held is None and not self.scheduler.has_work():
                    await self._idle()
                    continue
                held = await self._step(held)
        finally:
            self.forwards.returned()
            if held is not None:
                self._publish(held)
            self.alive = False
            self._abort_all("abort")
            self.forwards.shutdown()

    def _admit(self, held: HeldStep | None) -> HeldStep | None:
        """Arrivals join the scheduler; aborts land once no held step still has their tokens to post-process
        (so a metered token is always an emitted one)."""
        self._take_arrivals()
        if held is not None and held.feeds_sampler:
            # NOTE: a logits processor (a grammar) may be fed by an observer of TokensEmitted
            # (plugins/structured prefetches masks so): that token must be published before the
            # next sampler runs, so the held step's post-processing goes first.
            self._publish(held)
            held = None
        if held is None:
            self._take_aborts()
        return held

    async def _idle(self) -> None:
        if not self._inbox and not self._aborts:
            self._wake = anyio.Event()
            await self._wake.wait()

    async def _step(self, held: HeldStep | None) -> HeldStep | None:
        """One engine step; returns it held (async scheduling) or None (published already).

        Async scheduling: after step N's forward its tokens are appended at once (step N+1's inputs need
        them), then step N+1 is scheduled and its forward started, and only then does step N's output
        stage run (detokenize, stops, parsers, filters) and its events go out. A request the output
        stage ends there was already given a row of step N+1: it is FINISHED at once (its Finished event
        counts the tokens up to N), its blocks are freed once that forward is done, and its step N+1
        token is dropped unseen. A request whose length limit ends it is post-processed at once, so it
        is never scheduled past its limit.
        """
        t0 = now()
        plan = self.scheduler.schedule() if self.scheduler.has_work() else SchedulePlan()
        if plan and self.bursts is not None:
            waiting = bool(self._inbox or self._aborts or self.scheduler.num_waiting)
            plan.num_steps = self.bursts.steps_for(plan, self.window, self.runner, self.kv, waiting)
        t1 = now()
        events: list[Any] = []
        self._note_scheduling(plan, t1, events)
        forward = self.forwards.start(plan) if plan else None
        if held is not None:
            self._publish(held)  # step N's output stage, while step N+1's forward computes
        if self._overlap or forward is None:
            self.bus.publish(events)
            events = []
        if forward is None:
            # Nothing fits this step (e.g. every block held by requests being aborted): yield to
            # let aborts and new arrivals in rather than spinning.
            if self.scheduler.has_work():
                await anyio.sleep(0.001)
            return None
        try:
            output = await forward
        except Exception as e:  # the step failed: fail its requests, keep the engine alive
            self.forwards.returned()
            self._fail_step(plan, e, events)
            self.bus.publish(events)
            return None
        t2 = now()
        self.forwards.returned()
        if self.bursts is not None:
            self.bursts.observe(plan, output.forward_s or (t2 - t1), len(output.burst) if output.burst else 1)
        if output.burst is not None:   # every token through its output stage now: nothing held
            self._apply_burst(plan, output, events)
            self._publish(HeldStep([], events, self._step_done(plan, output, t0, t1, t2), t2))
            self._abort_stale()
            return None
        if self._overlap:
            self._take_aborts()
        todo = self._apply(plan, output, t2, events)
        step = HeldStep(todo, events, self._step_done(plan, output, t0, t1, t2), t2)
        if self._overlap:
            self._abort_stale()
            return step
        self._publish(step)
        self._abort_stale()
        return None

    def _publish(self, step: HeldStep) -> None:
        """A step's deferred output stage (async scheduling: its tokens not at their limit) and its
        events, its StepDone last."""
        events, t = step.events, step.t
        for rec, token, lp in step.todo:
            if rec.request.status is not Status.FINISHED:
                self._emit(rec, token, lp, t, events)
        events.append(step.done)
        self.bus.publish(events)

    # ---- admit: arrivals join the scheduler, aborts end requests between forwards -------

    def _take_arrivals(self) -> None:
        if self._inbox:
            inbox, self._inbox = self._inbox, []
            for rec in inbox:
                self.records[rec.request.request_id] = rec
                self.scheduler.add(rec.request)

    def _take_aborts(self) -> None:
        if self._aborts:
            aborts, self._aborts = self._aborts, {}
            events: list[Any] = []
            for rid, reason in aborts.items():
                rec = self.records.get(rid)
                if rec is not None:
                    self._finish(rec, rec.output.close(reason), now(), events)
            self.bus.publish(events)

    # ---- schedule -----------------------------------------------------------------------

    def _note_scheduling(self, plan: SchedulePlan, t: float, events: list) -> None:
        for req in plan.preempted:
            events.append(Preempted(request_id=req.request_id, task_id=req.task_id, ts=t,
                                    recompute_tokens=req.num_tokens))
        for req in plan.newly_scheduled:
            rec = self.records[req.request_id]
            if rec.scheduled is None:
                rec.scheduled = t
                events.append(RequestScheduled(request_id=req.request_id, task_id=req.task_id, ts=t,
                                               cached_tokens=req.num_cached_tokens))

    # ---- prefill / decode: one forward of the plan, sampling included, in the worker thread ---

    def _overlap_ok(self) -> bool:
        """Async scheduling needs the plan handed to the worker thread at once (asyncio, see ForwardWorker.start)."""
        if not self.async_scheduling:
            return False
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return True

    def _fail_step(self, plan: SchedulePlan, e: Exception, events: list) -> None:
        log.exception("model step failed")
        self.last_error = f"{type(e).__name__}: {e}"
        for chunk in plan.chunks:
            self._fail(chunk.request, type(e).__name__, str(e), events)

    # ---- publish: the step's end --------------------------------------------------------

    def _step_done(self, plan: SchedulePlan, output: StepOutput, t0: float, t1: float, t2: float) -> StepDone:
        """Count the step and describe it (schedule from t0, forward from t1, applied from t2)."""
        steps = len(output.burst) if output.burst else 1
        self.step_count += steps   # forwards: a burst's steps each count
        kv_usage = 1.0 - self.kv.num_free_blocks() / self.kv.num_blocks
        return StepDone(step=self.step_count, num_tokens=plan.num_tokens * steps, num_requests=len(plan.chunks),
                        num_waiting=self.scheduler.num_waiting, num_running=self.scheduler.num_running,
                        kv_usage=kv_usage, schedule_s=t1 - t0, forward_s=output.forward_s or (t2 - t1),
                        step_s=now() - t0, num_steps=steps)

    def _abort_stale(self) -> None:
        """Every 64 steps: abort requests whose stream nobody has read for consumer_timeout_s."""
        if self.step_count - self._stale_checked >= 64:
            self._stale_checked = self.step_count
            for rid in self.bus.stale_streams(now(), self.consumer_timeout_s):
                self.abort(rid)

    def _abort_all(self, reason: str) -> None:
        events: list[Any] = []
        for rec in self._inbox:
            self.records[rec.request.request_id] = rec
            self.scheduler.add(rec.request)
        self._inbox = []
        for rec in list(self.records.values()):
            self._finish(rec, rec.output.close(reason), now(), events)
        self.bus.publish(events)
