"""Provides the built-in scheduler (`scheduler = "default"`) and its default waiting queue
(`waiting_queue = "default"`: the order `scheduling_policy` names, fcfs or priority).

`plugin_config["scheduler"]["watermark"]` (default 0.01) is the fraction of KV blocks kept free
when admitting a new request while others run.
"""
from __future__ import annotations

from typing import Any

from modelcall.core import WaitingQueue, hookimpl
from modelcall.plugins.scheduler.policy import make_waiting_queue
from modelcall.plugins.scheduler.scheduler import DefaultScheduler


@hookimpl(trylast=True)
def provide_waiting_queue(config: Any) -> WaitingQueue | None:
    if not config.wants("waiting_queue", "default") or config.scheduling_policy == "fair":
        return None  # fair: the fair_share plugin's queue
    return make_waiting_queue(config.scheduling_policy)


def provide_scheduler(config: Any, kv_cache: Any, waiting_queue: WaitingQueue | None = None) -> DefaultScheduler | None:
    if not config.wants("scheduler", "default"):
        return None
    options = config.plugin_config.get("scheduler", {})
    return DefaultScheduler(kv_cache, max_num_seqs=config.max_num_seqs,
                            max_num_batched_tokens=config.max_num_batched_tokens,
                            policy=config.scheduling_policy, watermark=float(options.get("watermark", 0.01)),
                            waiting=waiting_queue,
                            max_loras=config.max_loras if getattr(config, "lora_enabled", False) else None)


# NOTE: pluggy never passes an argument that has a default, so the hook implementation names
# `waiting_queue` without one; `provide_scheduler` above stays callable with the first two.
@hookimpl(trylast=True, specname="provide_scheduler")
def _provide_scheduler_hook(config: Any, kv_cache: Any, waiting_queue: Any) -> DefaultScheduler | None:
    return provide_scheduler(config, kv_cache, waiting_queue)
