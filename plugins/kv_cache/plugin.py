"""Provides the built-in paged KV cache policy (`kv_cache = "paged"`) and its default eviction
order (`eviction_policy = "lru"`: least recently freed first)."""
from __future__ import annotations

from typing import Any

from modelcall.core import EvictionPolicy, hookimpl
from modelcall.core.plan import kv_groups
from modelcall.plugins.kv_cache.free_queue import LRUFreeQueue
from modelcall.plugins.kv_cache.policy import PagedKVCache


@hookimpl(trylast=True)
def provide_eviction_policy(config: Any, num_blocks: int) -> LRUFreeQueue | None:
    if not config.wants("eviction_policy", "lru"):
        return None
    return LRUFreeQueue(range(num_blocks))


def provide_kv_cache(config: Any, spec: Any, num_blocks: int,
                     eviction_policy: EvictionPolicy | None = None) -> PagedKVCache | None:
    if not config.wants("kv_cache", "paged"):
        return None
    return PagedKVCache(num_blocks, config.block_size, identity=spec.identity or spec.name,
                        enable_prefix_caching=config.enable_prefix_caching, free_queue=eviction_policy,
                        group_windows=group_windows(spec), max_chunk=config.max_num_batched_tokens)


def group_windows(spec: Any) -> tuple[int, ...]:
    """The window of each KV group of the model (0: full attention), as the runner lays its cache out."""
    return tuple(g.window for g in kv_groups(tuple(getattr(spec, "layer_windows", ()) or ()), spec.num_layers))


# NOTE: pluggy never passes an argument that has a default, so the hook implementation names
# `eviction_policy` without one; `provide_kv_cache` above stays callable with the first three.
@hookimpl(trylast=True, specname="provide_kv_cache")
def _provide_kv_cache_hook(config: Any, spec: Any, num_blocks: int, eviction_policy: Any) -> PagedKVCache | None:
    return provide_kv_cache(config, spec, num_blocks, eviction_policy)


@hookimpl
def startup(kernel: Any) -> None:
    """Put the host-RAM and disk tiers behind the built-in pool when the configuration asks for them."""
    from modelcall.plugins.kv_cache.tier_setup import tiers_for
    kv = getattr(kernel, "kv", None)
    if isinstance(kv, PagedKVCache) and kv.tiers is None:
        tiers = tiers_for(kernel.config, kernel.spec, kernel.runner, kernel.model_dir)
        if tiers is not None:
            kv.attach_tiers(tiers)


@hookimpl
def shutdown(kernel: Any) -> None:
    """Write out what the disk tier still has queued (a graceful stop keeps every committed block)."""
    kv = getattr(kernel, "kv", None)
    if isinstance(kv, PagedKVCache) and kv.tiers is not None:
        kv.tiers.close()
