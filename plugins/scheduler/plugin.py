"""Provides the built-in scheduler (`scheduler = "default"`).

`plugin_config["scheduler"]["watermark"]` (default 0.01) is the fraction of KV blocks kept free
when admitting a new request while others run.
"""
from __future__ import annotations

from typing import Any

from modelcall.core import hookimpl
from modelcall.plugins.scheduler.scheduler import DefaultScheduler


@hookimpl(trylast=True)
def provide_scheduler(config: Any, kv_cache: Any) -> DefaultScheduler | None:
    if not config.wants("scheduler", "default"):
        return None
    options = config.plugin_config.get("scheduler", {})
    return DefaultScheduler(kv_cache, max_num_seqs=config.max_num_seqs,
                            max_num_batched_tokens=config.max_num_batched_tokens,
                            policy=config.scheduling_policy, watermark=float(options.get("watermark", 0.01)))
