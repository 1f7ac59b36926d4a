"""An event collector: a plugin that records every event a kernel publishes, for assertions."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

from modelcall.core import hookimpl
from modelcall.events import Event, Finished, StepDone


class EventCollector:
    """Registers one observer for every request event and `StepDone`; keeps them in order.

    Hand it to a kernel as a plugin (`Kernel(plugins=[collector])`); the `events` fixture does
    that for every kernel a test makes with `make_kernel`.
    """

    modelcall_plugin_name = "modelcall.testing.events"

    def __init__(self) -> None:
        self.events: list[Any] = []
        self._changed: anyio.Event | None = None

    @hookimpl
    def register_observers(self, register: Callable[..., None]) -> None:
        register((Event, StepDone), self._observe, name=self.modelcall_plugin_name)

    def _observe(self, event: Any) -> None:
        self.events.append(event)
        if self._changed is not None:
            self._changed.set()

    # ---- reading ---------------------------------------------------------------------------

    def of(self, *types: type) -> list[Any]:
        """Events of the given types, in publication order."""
        return [e for e in self.events if isinstance(e, types)]

    def for_request(self, request_id: str) -> list[Any]:
        return [e for e in self.events if getattr(e, "request_id", None) == request_id]

    def names(self, request_id: str) -> list[str]:
        """The event class names of one request, in order: handy for timeline assertions."""
        return [type(e).__name__ for e in self.for_request(request_id)]

    def finished(self) -> dict[str, Finished]:
        """Request id -> its Finished event."""
        return {e.request_id: e for e in self.of(Finished)}

    def completion_order(self) -> list[str]:
        """Request ids in the order they finished."""
        return [e.request_id for e in self.of(Finished)]

    async def wait_for(self, predicate: Callable[[list[Any]], bool], timeout_s: float = 30.0) -> None:
        """Wait until `predicate(self.events)` holds; fails the test after `timeout_s`."""
        with anyio.fail_after(timeout_s):
            while not predicate(self.events):
                self._changed = anyio.Event()
                await self._changed.wait()

    def clear(self) -> None:
        self.events.clear()

    def __len__(self) -> int:
        return len(self.events)
