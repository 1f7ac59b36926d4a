"""The eviction-order and waiting-queue seams: a plugin changes only an order, the built-in stage keeps the rest."""
from collections import OrderedDict

import pytest

from modelcall.core import ConfigError, EvictionPolicy, KernelConfig, KeyedWaitingQueue, WaitingQueue, hookimpl
from modelcall.events import PrefillDone
from modelcall.plugins.kv_cache.free_queue import LRUFreeQueue
from modelcall.plugins.scheduler.queues import FCFSQueue, PriorityQueue

pytestmark = pytest.mark.anyio


def test_the_builtin_orders_satisfy_the_core_protocols():
    assert isinstance(LRUFreeQueue(range(4)), EvictionPolicy)
    assert isinstance(FCFSQueue(), WaitingQueue) and isinstance(PriorityQueue(), WaitingQueue)


class MRU:
    """Most recently freed first, counting the hits it is told about."""

    modelcall_plugin_name = "mru"

    def __init__(self, num_blocks):
        self.order = OrderedDict.fromkeys(range(num_blocks))
        self.hits = 0

    def push(self, block_id):
        self.order[block_id] = None

    def remove(self, block_id):
        del self.order[block_id]

    def pop(self):
        return self.order.popitem(last=True)[0]

    def hit(self, block_id):
        self.hits += 1

    def __len__(self):
        return len(self.order)


class Orders:
    modelcall_plugin_name = "orders"

    def __init__(self):
        self.eviction, self.queue = None, None

    @hookimpl
    def provide_eviction_policy(self, config, num_blocks):
        if config.wants("eviction_policy", "mru"):
            self.eviction = MRU(num_blocks)
        return self.eviction

    @hookimpl
    def provide_waiting_queue(self, config):
        if config.wants("waiting_queue", "lifo"):
            self.queue = LIFO()
        return self.queue


class LIFO(FCFSQueue):
    """Newest request first (a preempted one still goes to the front)."""

    def push(self, request):
        self.push_front(request)


async def test_the_builtin_stages_take_the_orders_a_plugin_provides(make_kernel):
    orders = Orders()
    async with make_kernel(plugins=[orders], num_kv_blocks=16, block_size=16, max_num_seqs=1) as kernel:
        assert kernel.host.providers["eviction_policy"] == "orders" and kernel.host.providers["kv_cache"] == "paged_kv"
        assert kernel.host.providers["waiting_queue"] == "orders" and kernel.host.providers["scheduler"] == "scheduler"
        prompt = list(range(10, 43))  # two full blocks cached
        for rid in ("a", "b"):
            await kernel.complete(prompt_token_ids=prompt, request_id=rid, max_tokens=1)
        assert orders.eviction.hits == 2 and len(orders.eviction) == 16
        blocker = await kernel.submit(prompt_token_ids=[5, 6, 7], max_tokens=8, ignore_eos=True)
        async for ev in blocker:
            if isinstance(ev, PrefillDone):
                break  # it holds the only slot: the next three all wait in the queue
        handles = [await kernel.submit(prompt_token_ids=[3, 4, i], request_id=f"r{i}", max_tokens=1)
                   for i in range(3)]
        done = [await h.result() for h in handles]
        await blocker.result()
    order = sorted(done, key=lambda c: c.finished.timings.finished)
    assert [c.request_id for c in order] == ["r2", "r1", "r0"]  # newest first, as LIFO says


async def test_a_named_order_nobody_provides_is_an_error_an_open_one_falls_back(make_kernel):
    with pytest.raises(ConfigError, match="waiting_queue"):
        async with make_kernel(waiting_queue="nobody"):
            pass
    from modelcall.plugins.scheduler import DefaultScheduler

    class OwnScheduler:  # the built-in scheduler plugin (and its default queue) blocked
        got = "not called"

        @hookimpl
        def provide_scheduler(self, kv_cache, waiting_queue):
            self.got = waiting_queue
            return DefaultScheduler(kv_cache)

    own = OwnScheduler()
    async with make_kernel(blocked=["no:scheduler"], plugins=[own]) as kernel:
        assert (await kernel.complete(prompt_token_ids=[3, 4, 5], max_tokens=2)).usage.completion_tokens == 2
    assert own.got is None  # nobody answered and none was named: no error


def test_a_provider_written_before_the_seams_keeps_working():
    from modelcall.core import PluginHost

    class OldScheduler:
        @hookimpl
        def provide_scheduler(self, config, kv_cache):
            return ("old", kv_cache)

    host = PluginHost([OldScheduler()], load_entrypoints=False)
    assert host.provide("provide_scheduler", "scheduler", config=KernelConfig(), kv_cache="kv",
                        waiting_queue=FCFSQueue()) == ("old", "kv")


class ByRank(KeyedWaitingQueue):
    """An order that is a key of the request: its `priority` field, read at push time."""

    def key(self, request, preempted):
        return (request.priority,)


def _queued(rid, rank):
    from modelcall.core import Request, SamplingParams
    return Request(rid, [3, 4, 5], SamplingParams.create(), max_tokens=1, priority=rank)


def test_a_keyed_queue_admits_the_lowest_key_first_ties_in_push_order_and_skips_removed_requests():
    q = ByRank()
    assert isinstance(q, WaitingQueue)
    a, b, c, d = _queued("a", 5), _queued("b", 1), _queued("c", 5), _queued("d", 0)
    for r in (a, b, c, d):
        q.push(r)
    assert [r.request_id for r in q] == ["d", "b", "a", "c"] and len(q) == 4
    assert q.remove(d) and q.peek() is b and q.get("d") is None
    # b leaves and comes back with another key: only its new place counts, not its stale heap entry
    assert q.remove(b)
    b.priority = 9
    q.push_front(b)
    assert [q.pop().request_id for _ in range(3)] == ["a", "c", "b"] and len(q) == 0


def test_a_keyed_queue_without_a_key_says_so():
    with pytest.raises(NotImplementedError):
        KeyedWaitingQueue().push(_queued("a", 0))
