"""`--scheduling fair`: the built-in scheduler admits from a `FairQueue` (Virtual Token Counter per
tenant, within each priority level).

    modelcall serve --api-keys keys.toml --scheduling fair
    plugin_config = {"fair_share": {"input_weight": 1.0, "output_weight": 2.0,   # the defaults
                                    "newcomer_step_tokens": 0, "reserve_tokens": 128, "chunk_tokens": 256,
                                    "active_window_s": 5.0, "fast_lane": true}}

The fast lane (core/policies.py NewcomerTerms): a request of a tenant with nothing running is admitted
before the running requests are scheduled, in a step they add at most `newcomer_step_tokens` to;
`reserve_tokens` of KV room are kept for such requests; and while more than one tenant was active
within `active_window_s`, a step holds at most `chunk_tokens` of prefill (0: no such cap), so the
step in flight when a newcomer arrives is short. `"fast_lane": false` turns all three off.

A tenant is the caller's key name; each key's `weight` in the key file is its share (default 1.0).
"""
from __future__ import annotations

from typing import Any

from modelcall.core import hookimpl
from modelcall.core.metering import Admission
from modelcall.core.policies import NewcomerTerms
from modelcall.plugins.fair_share.counters import VirtualTokenCounter
from modelcall.plugins.fair_share.queue import FairQueue

NAME = "fair_share"


def wanted(config: Any) -> bool:
    return getattr(config, "scheduling_policy", None) == "fair" and config.wants("waiting_queue", NAME)


@hookimpl(trylast=True)
def provide_waiting_queue(config: Any) -> FairQueue | None:
    if not wanted(config):
        return None
    options = (getattr(config, "plugin_config", None) or {}).get(NAME) or {}
    chunk = int(options.get("chunk_tokens", 256))
    terms = (NewcomerTerms(step_tokens=int(options.get("newcomer_step_tokens", 0)),
                           reserve_tokens=int(options.get("reserve_tokens", 128)), chunk_tokens=chunk or None)
             if options.get("fast_lane", True) else None)
    return FairQueue(VirtualTokenCounter(float(options.get("input_weight", 1.0)),
                                         float(options.get("output_weight", 2.0))), terms,
                     active_window_s=float(options.get("active_window_s", 5.0)))


class TenantTags:
    """A meter that only tells the queue whose each admitted request is (the caller and its weight,
    which the request itself does not carry), and when it ended."""

    def __init__(self, queue: FairQueue) -> None:
        self.queue = queue

    def reserve(self, adm: Admission) -> None:
        if adm.count_only:  # a token count is never queued, and nothing ends it
            return
        caller = adm.caller
        self.queue.tag(adm.request_id, caller.name if caller is not None else "",
                       float(getattr(caller, "weight", 1.0)) if caller is not None else 1.0)

    def observe(self, event: Any) -> None:
        self.queue.finished(event.request_id)


@hookimpl(trylast=True)
def register_meters(register: Any, config: Any, kernel: Any) -> None:
    queue = getattr(getattr(kernel, "scheduler", None), "waiting", None)
    if wanted(config) and isinstance(queue, FairQueue):
        register(TenantTags(queue))
