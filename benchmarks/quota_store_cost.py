"""What a shared quota store costs per request (issue 41): reserve + settle pairs against a real
redis-server on loopback and against the in-process store, in one run (a ratio of one run).

    taskset -c 1 .venv/bin/python benchmarks/quota_store_cost.py
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from redis_server import RedisServer  # noqa: E402 (the tests' redis-server launcher)

from modelcall.core.quota_store import QuotaLimits  # noqa: E402
from modelcall.plugins.auth.store_local import LocalQuotaStore  # noqa: E402
from modelcall.plugins.auth.store_redis import RedisQuotaStore  # noqa: E402

PAIRS, ROUNDS = 2000, 5


def per_pair(store: object) -> float:
    """Median over ROUNDS of the seconds one reserve + settle takes."""
    limits = QuotaLimits(rpm=10**9, tpm=10**12, daily_tokens=10**15)
    for _ in range(200):  # warm: connection, script cache
        store.reserve("k", limits, 100, "d")
    runs = []
    for _ in range(ROUNDS):
        t = time.perf_counter()
        for _ in range(PAIRS):
            store.reserve("k", limits, 100, "d")
            store.settle("k", limits, 50, "d", False)
        runs.append((time.perf_counter() - t) / PAIRS)
    return statistics.median(runs)


def main() -> None:
    server = RedisServer(Path(tempfile.mkdtemp()))
    server.start()
    try:
        local, shared = per_pair(LocalQuotaStore()), per_pair(RedisQuotaStore(server.url))
    finally:
        server.kill()
    print(f"reserve + settle: in-process {local * 1e6:.1f} us, Redis on loopback {shared * 1e6:.1f} us, "
          f"ratio {shared / local:.0f}x")


if __name__ == "__main__":
    main()
