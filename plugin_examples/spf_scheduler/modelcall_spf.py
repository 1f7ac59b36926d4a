"""modelcall-spf: shortest-prompt-first admission for modelcall's scheduler.

Waiting requests are admitted shortest prompt first (ties: arrival order), so a burst of short
questions is not stuck behind one long document. Only the waiting queue changes: the built-in
scheduler still batches, chunks prefills and preempts. A preempted request goes back ahead of
every request that never ran, so nothing starves once started.

Select it with `waiting_queue = "spf"` (or leave `auto`: an installed plugin is asked first).
"""
from __future__ import annotations

from typing import Any

from modelcall.core import KeyedWaitingQueue, Request, hookimpl

__version__ = "0.1.0"


@hookimpl
def provide_waiting_queue(config: Any) -> ShortestPromptFirst | None:
    return ShortestPromptFirst() if config.wants("waiting_queue", "spf") else None


class ShortestPromptFirst(KeyedWaitingQueue):
    """A `modelcall.core.WaitingQueue` keyed (never ran?, prompt length): the heap, lazy deletion and
    ties in arrival order come from `modelcall.core.KeyedWaitingQueue`."""

    def key(self, request: Request, preempted: bool) -> tuple[int, int]:
        # NOTE: a preempted request has done work already: it goes ahead of everyone who never ran.
        return (0 if preempted else 1), request.num_prompt_tokens
