"""The engine's forward hand-off: one worker thread runs `runner.execute` off the event loop, and requests that end
while a forward runs keep their blocks (that forward may still read or write them) until it is done."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor

import anyio

from modelcall.core.plan import SchedulePlan, StepOutput
from modelcall.core.request import Request
from modelcall.core.stages import ModelRunner, Scheduler


class ForwardWorker:
    """Starts one forward at a time and frees the blocks of requests that ended during it once it returns."""

    def __init__(self, runner: ModelRunner, scheduler: Scheduler) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self._executor: ThreadPoolExecutor | None = None
        self._in_flight = False               # a forward is running: ended requests keep their blocks
        self._deferred: list[Request] = []    # ended while a forward ran: scheduler.finish once it is done

    def start(self, plan: SchedulePlan) -> Awaitable[StepOutput]:
        """Hand `plan` to the worker thread (prefill and decode rows in one forward, then sampling); from here until
        `returned`, ended requests keep their blocks.

        NOTE: anyio.to_thread.run_sync yields to the event loop *before* handing work to its thread,
        so every consumer the last step woke (an SSE handler per streaming request) would run before
        this forward starts, serializing front-end work with the model. On asyncio the plan is
        handed over first and the consumers run while the forward computes.
        """
        self._in_flight = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # another anyio backend
            return anyio.to_thread.run_sync(self.runner.execute, plan)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="modelcall-step")
        return loop.run_in_executor(self._executor, self.runner.execute, plan)

    def returned(self) -> None:
        """The forward handed over by `start` is done: requests ended meanwhile free their blocks."""
        self._in_flight = False
        if self._deferred:
            deferred, self._deferred = self._deferred, []
            for req in deferred:
                self.scheduler.finish(req)

    def release(self, request: Request) -> None:
        """`request` ended: its blocks go back now, or once the running forward is done."""
        if self._in_flight:
            self._deferred.append(request)
        else:
            self.scheduler.finish(request)

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
