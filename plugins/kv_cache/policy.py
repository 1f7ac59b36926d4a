"""`PagedKVCache`: the built-in `KVCachePolicy` — block tables, prefix matching and committing full blocks."""
from __future__ import annotations

from collections.abc import Callable

from modelcall.core.plan import GROUP_TABLES
from modelcall.core.request import Request
from modelcall.plugins.kv_cache.block_pool import BlockPool
from modelcall.plugins.kv_cache.free_queue import FreeQueue
from modelcall.plugins.kv_cache.hashing import extend_block_hashes
from modelcall.plugins.kv_cache.tiered_match import match_with_tiers
from modelcall.plugins.kv_cache.tiers import KVTiers

RELEASED = -1  # a block-table entry whose block went back to the pool (out of its layers' window)


class PagedKVCache:
    """Paged KV block ids for every request, with optional prefix caching.

        block_table:  [ b7 b2 b9 | b4 ]      block_size = 4, 14 known tokens, 13 computed
        tokens:        0..3 4..7 8..11 12..13
                       <- cached/committed ->  (full blocks keyed for reuse once computed)

    `free_queue` decides which free block is reused next (the eviction order): LRU by default.

    `group_windows` has one entry per KV group of the model (`modelcall.core.kv_groups`): 0 for full
    attention, else the group's sliding window. Every group has its own table over the one pool (group 0's
    is `request.block_table`, the others `request.extra[GROUP_TABLES]`); a sliding group gives blocks that
    left its window back to the pool (still findable by their prefix key) and their entries become
    RELEASED, so it holds about window / block_size blocks however long the request runs.

        window = 8, block_size = 4, 14 computed:  [ -1 b2 b9 b4 ]   the next query (position 14)
                                                                  sees keys 7..14: block 0 is out
    """

    def __init__(self, num_blocks: int, block_size: int, *, identity: str = "", enable_prefix_caching: bool = True,
                 free_queue: FreeQueue | None = None, group_windows: tuple[int, ...] = (0,),
                 max_chunk: int = 2048) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.identity = identity
        self.enable_prefix_caching = enable_prefix_caching
        self.group_windows = tuple(group_windows) or (0,)
        self.max_chunk = max_chunk   # the most tokens one step computes for a request (the token budget)
        self.pool = BlockPool(num_blocks, free_queue)
        self.num_queries = 0  # tokens looked up by match_prefix
        self.num_hits = 0     # tokens found
        self.tiers: KVTiers | None = None   # host RAM and disk behind the pool (attach_tiers); None: the pool only

    @property
    def window(self) -> int:
        """The window of a model whose every layer slides alike (0: some layer reads every block)."""
        return self.group_windows[0] if len(self.group_windows) == 1 else 0

    def tables(self, request: Request) -> list[list[int]]:
        """`request`'s block table of each KV group (the lists themselves: extend them in place)."""
        if len(self.group_windows) == 1:
            return [request.block_table]
        extra = request.extra.get(GROUP_TABLES)
        if extra is None:
            extra = request.extra[GROUP_TABLES] = [[] for _ in self.group_windows[1:]]
        return [request.block_table, *extra]

    def _key(self, group: int, key: bytes) -> bytes:
        return key if group == 0 else key + b"#%d" % group   # a group's blocks hold other layers' K/V

    # ---- the KVCachePolicy protocol ---------------------------------------------------------

    def match_prefix(self, request: Request) -> int:
        if request.block_table or any(self.tables(request)[1:]):
            raise ValueError(f"match_prefix needs a request holding no blocks; {request.request_id} holds "
                             f"{len(request.block_table)}")
        if not self.enable_prefix_caching:
            return 0
        # NOTE: never the last known token: its forward pass gives the next token's logits. For a
        # new request that is the last prompt token; after preemption, the last output token.
        max_blocks = (request.num_tokens - 1) // self.block_size
        hashes = extend_block_hashes(request, max_blocks, self.block_size, self.identity)
        lookup = self.pool.lookup
        if self.tiers is None:
            max_blocks = self.longest_match(hashes, max_blocks, lambda key: lookup(key) is not None)
            for g, (w, table) in enumerate(zip(self.group_windows, self.tables(request))):
                first = self._first_seen(max_blocks, w) if w else 0
                hits = [lookup(self._key(g, hashes[i])) for i in range(first, max_blocks)]
                self.pool.touch(hits)
                table[:] = [RELEASED] * first + hits
            disk_tokens = 0
        else:
            max_blocks, disk_blocks = match_with_tiers(self, self.tiers, request, hashes, max_blocks)
            disk_tokens = disk_blocks * self.block_size
        if not request.scheduled_once:   # usage counts the first scheduling's hit (as num_cached_tokens)
            request.num_cached_disk_tokens = disk_tokens
        num_hit_tokens = max_blocks * self.block_size
        self.num_queries += request.num_tokens
        self.num_hits += num_hit_tokens
        return num_hit_tokens

    def longest_match(self, hashes: list[bytes], max_blocks: int, found: Callable[[bytes], bool]) -> int:
        """The most leading blocks k <= max_blocks a request can take for which `found` holds every block
        it needs: from a full group blocks 0..k-1; from a sliding group only the ones the next query
        (position k * block_size) still sees, the others may be long reused."""
        for g, w in enumerate(self.group_windows):
            if not w:
                k = 0
                while k < max_blocks and found(self._key(g, hashes[k])):
                    k += 1
                max_blocks = k
        sliding = [(g, w) for g, w in enumerate(self.group_windows) if w]
        while max_blocks > 0 and not all(found(self._key(g, hashes[i])) for g, w in sliding
                                         for i in range(self._first_seen(max_blocks, w), max_blocks)):
            max_blocks -= 1   # every sliding group's window blocks, for one and the same k
        return max_blocks

    def needed_keys(self, hashes: list[bytes], num_blocks: int) -> list[tuple[int, int, bytes]]:
        """(group, block index, key) of every block a hit of `num_blocks` blocks takes, group by group."""
        out = []
        for g, w in enumerate(self.group_windows):
            first = self._first_seen(num_blocks, w) if w else 0
            out.extend((g, i, self._key(g, hashes[i])) for i in range(first, num_blocks))
        return out

    def prefetch(self, request: Request) -> None:
        """`request` just arrived: start reading from disk the blocks of its prefix the pool lacks, so they
        are in memory when it is scheduled (the tiers only; without them nothing to do)."""
        if self.tiers is None or not self.enable_prefix_caching or request.block_table:
            return
        max_blocks = (request.num_tokens - 1) // self.block_size
        hashes = extend_block_hashes(request, max_blocks, self.block_size, self.identity)
        lookup = self.pool.lookup
        self.tiers.prefetch([key for _, _, key in self.needed_keys(hashes, max_blocks) if lookup(key) is None])

    def attach_tiers(self, tiers: KVTiers) -> None:
        """Put the host-RAM and disk tiers behind this pool (at start-up, before any request)."""
        self.tiers = tiers
        self.pool.on_evict = tiers.evicted

    def allocate(self, request: Request, num_new_tokens: int) -> bool:
        tables = self.tables(request)
        for window, table in zip(self.group_windows, tables):
            if window:
                self._release_out_of_window(request, table, window)
        want = -(-(request.num_computed_tokens + num_new_tokens) // self.block_size)
        needed = sum(max(0, want - len(t)) for t in tables)
        if needed <= 0:
            return True
        if needed > self.pool.num_free():
            return False
        for table in tables:
            if want > len(table):
                table.extend(self.pool.take(want - len(table)))
        return True

    def commit(self, request: Request) -> None:
        if not self.enable_prefix_caching:
            return
        num_full = request.num_computed_tokens // self.block_size
        recorded = self.pool.block_hash
        hashes: list[bytes] | None = None
        for g, table in enumerate(self.tables(request)):
            first_new = num_full
            while first_new > 0 and table[first_new - 1] != RELEASED and recorded[table[first_new - 1]] is None:
                first_new -= 1  # keys are set in order: walk back to the last committed block
            if first_new == num_full:
                continue
            if hashes is None:
                hashes = extend_block_hashes(request, num_full, self.block_size, self.identity)
            for i in range(first_new, num_full):
                key = self._key(g, hashes[i])
                self.pool.cache(table[i], key)
                if self.tiers is not None and self.pool.cached[key] == table[i]:
                    self.tiers.committed(table[i], key)

    def fork(self, parent: Request, child: Request, num_tokens: int) -> list[tuple[int, int]] | None:
        """Give `child` (holding no blocks) the K/V of `parent`'s first `num_tokens` tokens: the full
        blocks shared, the last partial one copied on write (into a new block of the child's, since
        both will write their next tokens there). Returns the (source, destination) block copies the
        runner must make after the parent's K/V are written, or None (nothing changed) without a free
        block for the copy. Every KV group alike.

            parent  [ b7 b2 | b9 ]     num_tokens = 10, block_size = 4
            child   [ b7 b2 | b4 ]     b7, b2 shared (ref counts 2); b9 -> b4 copied
        """
        if child.block_table or any(self.tables(child)[1:]):
            raise ValueError(f"fork needs a child holding no blocks; {child.request_id} holds {len(child.block_table)}")
        full, partial = divmod(num_tokens, self.block_size)
        parents = self.tables(parent)
        if len(parent.block_table) < full + (1 if partial else 0):
            raise ValueError(f"{parent.request_id} holds {len(parent.block_table)} blocks, fewer than {num_tokens} tokens need")
        if partial and self.pool.num_free() < len(parents):
            return None
        copies: list[tuple[int, int]] = []
        for src, dst in zip(parents, self.tables(child)):
            shared = src[:full]
            self.pool.share(b for b in shared if b != RELEASED)
            dst[:] = shared
            if partial:
                (block,) = self.pool.take(1)
                dst.append(block)
                copies.append((src[full], block))
        return copies

    def trim(self, request: Request) -> None:
        """Give back the blocks past `request`'s known tokens (speculative decoding: a rejected draft's
        slots). They were taken this step and never committed, so nothing findable is lost."""
        keep = -(-request.num_tokens // self.block_size)
        for table in self.tables(request):
            if len(table) > keep:
                self.pool.release(b for b in reversed(table[keep:]) if b != RELEASED)
                del table[keep:]

    def free(self, request: Request) -> None:
        # NOTE: the tail first, so under LRU a request's last blocks (the least shared) are evicted first.
        for table in self.tables(request):
            self.pool.release(b for b in reversed(table) if b != RELEASED)
            table.clear()
        request.block_table = []

    def _first_seen(self, num_blocks: int, window: int) -> int:
        """The first block a query at position num_blocks * block_size reads with `window`."""
        return max(0, (num_blocks * self.block_size - window + 1) // self.block_size)

    def _release_out_of_window(self, request: Request, table: list[int], window: int) -> None:
        """Give back the blocks of `table` no later query of `request` reads.

        NOTE: the next query sits at position num_computed_tokens and sees keys from there - window + 1
        on, so blocks ending at or before that key are out of the window for good. They were committed
        by the step that filled them (commit runs after every step), so they stay findable.
        """
        end = min((request.num_computed_tokens - window + 1) // self.block_size, len(table))
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

        NOTE: with a window W, a chunk of n tokens from position c holds blocks floor((c-W+1)/bs) ..
        ceil((c+n)/bs) - 1 of its group, at most ceil((n + W - 1) / bs) + 1, and n <= the token budget.
        """
        whole = -(-num_tokens // self.block_size)
        n = min(num_tokens, self.max_chunk)
        return sum(min(whole, -(-(n + w - 1) // self.block_size) + 1) if w else whole for w in self.group_windows)

    def blocks_held(self, request: Request) -> int:
        """Blocks `request` holds now, over every group (tables less their released entries)."""
        return sum(b != RELEASED for t in self.tables(request) for b in t)

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
            **(self.tiers.stats() if self.tiers is not None else {}),
        }

    def reset_prefix_cache(self) -> None:
        self.pool.forget_cached()
        if self.tiers is not None:
            self.tiers.clear()
