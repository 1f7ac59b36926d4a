"""The built-in paged KV cache policy: block ids, reference counts, a lazy-eviction free list, prefix caching."""
from modelcall.plugins.kv_cache.free_queue import FreeQueue, LRUFreeQueue
from modelcall.plugins.kv_cache.policy import PagedKVCache

__all__ = ["FreeQueue", "LRUFreeQueue", "PagedKVCache"]
