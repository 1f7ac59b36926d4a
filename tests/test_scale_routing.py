"""The prefix-aware ranking (plugins/scale/ranking.py) on plain replica ids, and the routing keys
(core/prefix_keys.py) against the KV cache's own block hashes. No Ray needed."""
from __future__ import annotations

import random

from modelcall.core import Request, SamplingParams
from modelcall.core.prefix_keys import prefix_block_keys, root_key
from modelcall.plugins.kv_cache.hashing import extend_block_hashes
from modelcall.plugins.scale.ranking import PrefixTable, rank, rendezvous


def test_routing_keys_are_the_kv_caches_block_hashes() -> None:
    rng = random.Random(3)
    ids = [rng.randrange(1000) for _ in range(16 * 5 + 7)]
    req = Request("r", ids, SamplingParams(), cache_salt="tenant-a", max_tokens=4)
    cache = extend_block_hashes(req, 5, 16, "model-x")
    assert prefix_block_keys(ids, 16, root_key("model-x", None, "tenant-a"), 8) == cache
    assert prefix_block_keys(ids, 16, root_key("model-x", None, "tenant-b"), 8)[0] != cache[0]
    assert len(prefix_block_keys(ids[:32], 16, root_key("m"), 8)) == 1  # the block with the last token never counts


def test_new_prefixes_go_to_their_rendezvous_home_and_stay_there() -> None:
    table, loads = PrefixTable(), {"a": 0, "b": 0, "c": 0}
    keys = (b"k1", b"k2", b"k3")
    home = rendezvous(b"k1", list(loads))[0]
    assert rank(keys, loads, table)[0] == [home]
    table.add(keys, home)
    loads[home] = 3  # busier, but within the spread threshold: the prefix's holder still wins
    assert rank(keys + (b"k4",), loads, table)[0] == [home]


def test_past_the_load_spread_the_least_loaded_goes_first() -> None:
    table, keys = PrefixTable(), (b"x",)
    table.add(keys, "a")
    assert rank(keys, {"a": 9, "b": 2, "c": 4}, table, imbalance_threshold=4) == [["b"], ["c"], ["a"]]


def test_a_replica_leaving_moves_only_its_own_prefixes() -> None:
    ids = [f"r{i}" for i in range(8)]
    firsts = [bytes([i, j]) for i in range(40) for j in range(5)]
    before = {k: rendezvous(k, ids)[0] for k in firsts}
    after = {k: rendezvous(k, ids[1:])[0] for k in firsts}
    moved = [k for k in firsts if before[k] != after[k]]
    assert moved and all(before[k] == "r0" for k in moved)


def test_a_pinned_fork_goes_where_its_parent_is_and_a_dead_replica_is_forgotten() -> None:
    table = PrefixTable()
    table.add((b"p",), "a")
    assert rank((b"p",), {"a": 0, "b": 0}, table, pin="b") == [["b"]]
    table.forget("a")
    assert table.matched((b"p",), "a") == 0
