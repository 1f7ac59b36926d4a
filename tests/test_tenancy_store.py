"""The shared quota store's Lua scripts against a real redis-server: two clients (as two processes
would hold) and eight threads reserving at once never pass a key's limits; settlement gives back
what was not used; a restarted Redis (append-only file) keeps the counters; a dead one raises
StoreUnavailable."""
from __future__ import annotations

import threading
import time

import pytest
from redis_server import redis_server  # noqa: F401 (the module-scoped fixture)

from modelcall.core.quota_store import QuotaLimits, StoreUnavailable
from modelcall.plugins.auth.store_local import LocalQuotaStore
from modelcall.plugins.auth.store_redis import RedisQuotaStore

DAY = "2026-12-06"


def _storm(stores: list, key: str, limits: QuotaLimits, tokens: int, attempts: int) -> tuple[list, float]:
    """8 threads over `stores` (round robin), `attempts` reservations in all: (refusals or None, seconds)."""
    results: list = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def client(i: int) -> None:
        start.wait()
        for j in range(attempts // 8):
            r = stores[(i + j) % len(stores)].reserve(key, limits, tokens, DAY)
            with lock:
                results.append(r)

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.monotonic() - t0


def test_two_clients_and_eight_threads_never_pass_the_requests_per_minute(redis_server):
    stores = [RedisQuotaStore(redis_server.url), RedisQuotaStore(redis_server.url)]
    limits = QuotaLimits(rpm=12)
    results, seconds = _storm(stores, "rpm-key", limits, 10, 120)
    accepted = sum(r is None for r in results)
    # a token bucket of 12 refills 12 a minute: what it may accept in `seconds` is 12 + 12 * seconds / 60
    assert 12 <= accepted <= 12 + int(12 * seconds / 60), (accepted, seconds)
    refusals = [r for r in results if r is not None]
    assert {r.limit for r in refusals} == {"rpm"}
    assert all(0 < r.retry_after <= 5.0 + 1e-6 for r in refusals)  # one request refills in 60 / 12 s


def test_the_daily_budget_holds_across_clients_and_settlement_gives_back_the_unused(redis_server):
    stores = [RedisQuotaStore(redis_server.url), RedisQuotaStore(redis_server.url)]
    limits = QuotaLimits(daily_tokens=500)
    results, _ = _storm(stores, "budget-key", limits, 60, 80)
    assert sum(r is None for r in results) == 8            # 8 x 60 = 480 <= 500 < 540
    client = redis_server.client()
    assert int(client.get(f"modelcall:quota:budget-key:day:{DAY}")) == 480
    refusal = next(r for r in results if r is not None)
    assert refusal.limit == "daily_tokens" and refusal.available == 20
    stores[0].settle("budget-key", limits, 50, DAY, False)   # a request that used 10 of its 60
    assert int(client.get(f"modelcall:quota:budget-key:day:{DAY}")) == 430
    assert stores[1].reserve("budget-key", limits, 60, DAY) is None  # 430 + 60 = 490 fits now
    assert stores[1].reserve("budget-key", limits, 60, DAY) is not None


def test_a_refused_request_is_given_back_to_the_minute_bucket(redis_server):
    store = RedisQuotaStore(redis_server.url)
    limits = QuotaLimits(rpm=2, tpm=100)
    assert store.reserve("give-back", limits, 40, DAY) is None
    assert store.reserve("give-back", limits, 40, DAY) is None
    assert store.reserve("give-back", limits, 40, DAY).limit == "rpm"
    store.settle("give-back", limits, 40, DAY, True)   # refused later (another meter): request and tokens back
    assert store.reserve("give-back", limits, 40, DAY) is None
    left = store.usage("give-back", limits, DAY)
    assert left["requests_left"] < 1 and 20 <= left["tokens_left"] < 21   # 100 - 40 - 40 (+ a little refill)


def test_a_restarted_redis_keeps_the_counters_and_a_dead_one_raises(redis_server):
    store = RedisQuotaStore(redis_server.url, timeout_s=0.2)
    limits = QuotaLimits(daily_tokens=100)
    assert store.reserve("restart-key", limits, 70, DAY) is None
    redis_server.kill()
    with pytest.raises(StoreUnavailable):
        store.reserve("restart-key", limits, 10, DAY)
    assert not store.ping()
    redis_server.start()
    assert store.reserve("restart-key", limits, 40, DAY).limit == "daily_tokens"  # 70 survived the restart
    assert store.reserve("restart-key", limits, 30, DAY) is None


def test_the_local_store_keeps_the_same_buckets():
    now = [1000.0]
    store = LocalQuotaStore(clock=lambda: now[0])
    limits = QuotaLimits(rpm=3, tpm=90)
    assert [store.reserve("k", limits, 30, DAY) for _ in range(3)] == [None, None, None]
    refusal = store.reserve("k", limits, 30, DAY)
    assert refusal.limit == "rpm" and refusal.retry_after == pytest.approx(20.0)
    now[0] += 20.0   # one request and 30 tokens refilled
    assert store.reserve("k", limits, 30, DAY) is None
    assert store.reserve("k", limits, 1, DAY).limit == "rpm"
