"""`PagedKVCache`: the built-in `KVCachePolicy` — block tables, prefix matching and committing full blocks."""
from __future__ import annotations

from modelcall.core.request import Request
from modelcall.plugins.kv_cache.block_pool import BlockPool
from modelcall.plugins.kv_cache.free_queue import FreeQueue
from modelcall.plugins.kv_cache.hashing import extend_block_hashes

RELEASED = -1  # a block-table entry whose block went back to the pool (out of every layer's window)


class PagedKVCache:
    """Paged KV block ids for every request, with optional prefix caching.

        block_table:  [ b7 b2 b9 | b4 ]      block_size = 4, 14 known tokens, 13 computed
        tokens:        0..3 4..7 8..11 12..13
                       <- cached/committed ->  (full blocks keyed for reuse once computed)

    `free_queue` decides which free block is reused next (the eviction order): LRU by default.

    With `window` (every layer attends to its last `window` tokens only, Mistral-style), blocks that
    fell out of the window go back to the pool (still findable by their prefix key) and their table
    entries become RELEASED: a request holds about window / block_size blocks however long it runs.

        window = 8, block_size = 4, 14 computed:  [ -1 b2 b9 b4 ]   the next query (position 14)
                                                                  sees keys 7..14: block 0 is out
    """

    def __init__(self, num_blocks: int, block_size: int, *, identity: str = "", enable_prefix_caching: bool = True,
                 free_queue: FreeQueue | None = None, window: int = 0, max_chunk: int = 2048) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.window = window
        self.max_chunk = max_chunk   # the most tokens one step computes for a request (the token budget)
        self.identity = identity
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks, free_queue)
        self.num_queries = 0  # tokens looked up by match_prefix
        self.num_hits = 0     # tokens found

    # ---- the KVCachePolicy protocol ---------------------------------------------------------

    def match_prefix(self, request: Request) -> int:
        if request.block_table:
            raise ValueError(f"match_prefix needs a request holding no blocks; {request.request_id} holds "
                             f"{len(request.block_table)}")
        if not self.enable_prefix_caching:
            return 0
        # NOTE: never the last known token: its forward pass gives the next token's logits. For a
        # new request that is the last prompt token; after preemption, the last output token.
        max_blocks = (request.num_tokens - 1) // self.block_size
        hashes = extend_block_hashes(request, max_blocks, self.block_size, self.identity)
        hits: list[int] = []
        for i in range(max_blocks):
            block = self.pool.lookup(hashes[i])
            if block is None:
                break
            hits.append(block)
        self.pool.touch(hits)
        request.block_table = hits
        num_hit_tokens = len(hits) * self.block_size
        self.num_queries += request.num_tokens
        self.num_hits += num_hit_tokens
        return num_hit_tokens

    def allocate(self, request: Request, num_new_tokens: int) -> bool:
        if self.window:
            self._release_out_of_window(request)
        needed = -(-(request.num_computed_tokens + num_new_tokens) // self.block_size) - len(request.block_table)
        if needed <= 0:
            return True
        if needed > self.pool.num_free():
            return False
        request.block_table.extend(self.pool.take(needed))
        return True

    def commit(self, request: Request) -> None:
        if not self.enable_prefix_caching:
            return
        num_full = request.num_computed_tokens // self.block_size
        table, recorded = request.block_table, self.pool.block_hash
        first_new = num_full
        while first_new > 0 and table[first_new - 1] != RELEASED and recorded[table[first_new - 1]] is None:
            first_new -= 1  # keys are set in order: walk back to the last committed block
        if first_new == num_full:
            return
        hashes = extend_block_hashes(request, num_full, self.block_size, self.identity)
        for i in range(first_new, num_full):
            self.pool.cache(table[i], hashes[i])

    def fork(self, parent: Request, child: Request, num_tokens: int) -> list[tuple[int, int]] | None:
        """Give `child` (holding no blocks) the K/V of `parent`'s first `num_tokens` tokens: the full
        blocks shared, the last partial one copied on write (into a new block of the child's, since
        both will write their next tokens there). Returns the (source, destination) block copies the
        runner must make after the parent's K/V are written, or None (nothing changed) without a free
        block for the copy.

            parent  [ b7 b2 | b9 ]     num_tokens = 10, block_size = 4
            child   [ b7 b2 | b4 ]     b7, b2 shared (ref counts 2); b9 -> b4 copied
        """
        if child.block_table:
            raise ValueError(f"fork needs a child holding no blocks; {child.request_id} holds {len(child.block_table)}")
        full, partial = divmod(num_tokens, self.block_size)
        if len(parent.block_table) < full + (1 if partial else 0):
            raise ValueError(f"{parent.request_id} holds {len(parent.block_table)} blocks, fewer than {num_tokens} tokens need")
        if partial and self.pool.num_free() < 1:
            return None
        shared = parent.block_table[:full]
        self.pool.share(b for b in shared if b != RELEASED)
        child.block_table = list(shared)
        if not partial:
            return []
        (block,) = self.pool.take(1)
        child.block_table.append(block)
        return [(parent.block_table[full], block)]

    def free(self, request: Request) -> None:
        # NOTE: the tail first, so under LRU a request's last blocks (the least shared) are evicted first.
        self.pool.release(b for b in reversed(request.block_table) if b != RELEASED)
        request.block_table = []

    def _release_out_of_window(self, request: Request) -> None:
        """Give back the blocks no later query of `request` reads.

        NOTE: the next query sits at position num_computed_tokens and sees keys from there - window + 1
        on, so blocks ending at or before that key are out of every layer's window for good. They were
        committed by the step that filled them (commit runs after every step), so they stay findable.
        """
        table = request.block_table
        end = min((request.num_computed_tokens - self.window + 1) // self.block_size, len(table))
        i = end - 1
        out: list[int] = []
        while i >= 0 and table[i] != RELEASED:   # walks only the newly released ones (older are -1)
            out.append(table[i])
            table[i] = RELEASED
            i -= 1
        if out:
            self.pool.release(out)

    def blocks_needed(self, num_tokens: int) -> int:
        """The most blocks a request of `num_tokens` tokens holds at once (the admission check's figure).

        NOTE: with a window, a chunk of n tokens from position c holds blocks floor((c-W+1)/bs) ..
        ceil((c+n)/bs) - 1, at most ceil((n + W - 1) / bs) + 1 of them, and n <= the token budget.
        """
        whole = -(-num_tokens // self.block_size)
        if not self.window:
            return whole
        n = min(num_tokens, self.max_chunk)
        return min(whole, -(-(n + self.window - 1) // self.block_size) + 1)

    def num_free_blocks(self) -> int:
        return self.pool.num_free()

    def stats(self) -> dict[str, float]:
        free = self.pool.num_free()
        return {
            "usage": 1.0 - free / self.num_blocks,
            "queries": float(self.num_queries),
            "hits": float(self.num_hits),
            "hit_rate": self.num_hits / self.num_queries if self.num_queries else 0.0,
            "num_free_blocks": float(free),
            "num_blocks": float(self.num_blocks),
            "num_cached_blocks": float(len(self.pool.cached)),
            "evictions": float(self.pool.num_evictions),
        }

    def reset_prefix_cache(self) -> None:
        self.pool.forget_cached()
