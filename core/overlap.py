"""vLLM's async scheduling for the engine loop: step N's post-processing (the output stage: detokenize, stops,
parsers, filters; then publish) runs while step N+1's forward computes.

A mixin of `Engine` (core/engine.py), which owns the request records, the scheduler and the plain loop; this file
holds only what the overlapped loop adds: starting a forward without awaiting it, the forward-critical half of
applying a step (`_advance`), the deferred half (`_post_process`), and the blocks of requests that ended while a
forward could still read them (`_free_deferred`).
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import anyio

from modelcall.core.plan import SchedulePlan, StepOutput
from modelcall.core.request import Request, Status
from modelcall.events import StepDone, now

if TYPE_CHECKING:
    from modelcall.core.engine import RequestRecord
    from modelcall.core.stages import ModelRunner, Scheduler
    from modelcall.events import EventBus


class AsyncScheduling:
    """The overlapped steps of `Engine` (`async_scheduling` on): see `_overlapped`."""

    # The engine's state this half reads and writes (set in Engine.__init__)
    async_scheduling: bool
    scheduler: Scheduler
    runner: ModelRunner
    bus: EventBus
    records: dict[str, RequestRecord]
    window: int
    _stopping: bool
    _in_flight: bool
    _deferred: list[Request]
    # ...and it calls the engine's own steps (_worker, _note_scheduling, _step_done, _fail_step, _computed,
    # _append, _emit, _apply_draft, _finish, _take_arrivals, _take_aborts, _abort_stale): one loop, two halves
    # of one class, so these stay Engine's and are not repeated here

    def _overlap_ok(self) -> bool:
        """Overlap needs the plan handed to the worker thread at once (asyncio, see `_forward`)."""
        if not self.async_scheduling:
            return False
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return True

    async def _overlapped(self) -> None:
        """Steps until the scheduler runs dry, each step's post-processing run during the next forward.

        After step N's forward its tokens are appended at once (`_advance`: step N+1's inputs need
        them), then step N+1 is scheduled and its forward started, and only then does step N's output
        stage run (detokenize, stops, parsers, filters) and its events go out. A request the output
        stage ends there was already given a row of step N+1: it is FINISHED at once (its Finished event
        counts the tokens up to N), its blocks are freed once that forward is done, and its step N+1
        token is dropped unseen. A request whose length limit ends it is post-processed at once, so it
        is never scheduled past its limit. Aborts are applied between forwards, when no token of theirs
        waits for post-processing, so a metered token is always an emitted one.
        """
        pending: tuple[list, list, StepDone, float] | None = None  # step N: (tokens to post-process, events, end, t)
        try:
            while not self._stopping:
                self._take_arrivals()
                if pending is not None and any(rec.request.logits_processors for rec, _, _ in pending[0]):
                    # NOTE: a logits processor (a grammar) may be fed by an observer of TokensEmitted
                    # (plugins/structured prefetches masks so): that token must be published before
                    # the next sampler runs, so this step's post-processing goes first.
                    self._post_process(*pending)
                    pending = None
                if pending is None:
                    self._take_aborts()
                    if not self.scheduler.has_work():
                        return
                t0 = now()
                plan = self.scheduler.schedule() if self.scheduler.has_work() else SchedulePlan()
                t1 = now()
                scheduling: list[Any] = []
                self._note_scheduling(plan, t1, scheduling)
                future = self._start_forward(plan) if plan else None
                if pending is not None:
                    self._post_process(*pending)
                    pending = None
                self.bus.publish(scheduling)
                if future is None:
                    if not plan and not self.scheduler.has_work():
                        continue
                    await anyio.sleep(0.001)  # nothing fits this step: let aborts and arrivals in
                    continue
                try:
                    output = await future
                except Exception as e:  # the step failed: fail its requests, keep the engine alive
                    self._forward_returned()
                    failed: list[Any] = []
                    self._fail_step(plan, e, failed)
                    self.bus.publish(failed)
                    continue
                t2 = now()
                self._forward_returned()
                self._take_aborts()
                events: list[Any] = []
                todo = self._advance(plan, output, t2, events)
                pending = (todo, events, self._step_done(plan, output, t0, t1, t2), t2)
                self._abort_stale()
        finally:
            self._forward_returned()
            if pending is not None:
                self._post_process(*pending)

    def _start_forward(self, plan: SchedulePlan) -> asyncio.Future:
        """Hand `plan` to the worker thread now; from here until it is awaited, ended requests keep their blocks."""
        self._in_flight = True
        return asyncio.get_running_loop().run_in_executor(self._worker(), self.runner.execute, plan)

    def _forward_returned(self) -> None:
        """The forward handed over by `_start_forward` is done: requests ended meanwhile free their blocks."""
        self._in_flight = False
        self._free_deferred()

    def _advance(self, plan: SchedulePlan, output: StepOutput, t: float, events: list) -> list[tuple]:
        """The forward-critical half of `_apply`: computed counts, K/V commits and the sampled tokens
        appended. Returns (record, token, logprobs) of each token whose output stage is still to run."""
        logprobs = output.logprobs
        spec = output.spec_tokens
        todo: list[tuple] = []
        for i, chunk in enumerate(plan.chunks):
            req = chunk.request
            if req.status is Status.FINISHED:  # ended while this forward ran: its row is dropped
                continue
            if spec is not None and spec[i] is not None:
                # NOTE: a verified draft goes through the output stage now, token by token (a stop may
                # end it mid-draft), so the next schedule proposes from the request's final tokens.
                self._apply_draft(chunk, spec[i], t, events)
                continue
            self._computed(chunk, output, i, t, events)
            token = output.token_ids[i]
            rec = self.records[req.request_id]
            if token is None:
                if req.max_tokens == 0 and req.num_computed_tokens >= req.num_prompt_tokens:
                    self._finish(rec, rec.output.close("length"), t, events)  # scored, nothing to generate
                continue
            self._append(rec, token, t, events)
            lp = logprobs[i] if logprobs is not None else None
            if req.num_output_tokens >= req.max_tokens or req.num_tokens >= self.window:
                self._emit(rec, token, lp, t, events)  # its last token: end it before the next schedule
            else:
                todo.append((rec, token, lp))
        return todo

    def _post_process(self, todo: list[tuple], events: list, done: StepDone, t: float) -> None:
        """Step N's output stage and events (its StepDone last), run while step N+1's forward computes."""
        for rec, token, lp in todo:
            if rec.request.status is not Status.FINISHED:
                self._emit(rec, token, lp, t, events)
        events.append(done)
        self.bus.publish(events)

    def _free_deferred(self) -> None:
        if self._deferred:
            deferred, self._deferred = self._deferred, []
            for req in deferred:
                self.scheduler.finish(req)
