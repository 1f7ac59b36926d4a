"""Provides the built-in paged KV cache policy (`kv_cache = "paged"`)."""
from __future__ import annotations

from typing import Any

from modelcall.core import hookimpl
from modelcall.plugins.kv_cache.policy import PagedKVCache


@hookimpl(trylast=True)
def provide_kv_cache(config: Any, spec: Any, num_blocks: int) -> PagedKVCache | None:
    if not config.wants("kv_cache", "paged"):
        return None
    return PagedKVCache(num_blocks, config.block_size, identity=spec.identity or spec.name,
                        enable_prefix_caching=config.enable_prefix_caching)
