"""Plugins keep per-kernel state on the kernel (`kernel.plugin_state`), not in module globals.

Two kernels built from the *same* KernelConfig object in one process keep their own metrics
registry and their own ledger observer: each kernel's /metrics counts only its own requests, and
stopping one kernel leaves the other's ledger recording.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from modelcall.core import Kernel, KernelConfig
from modelcall.plugins.ledger.store import open_readonly
from modelcall.testing.kernels import TEST_CONFIG, installed_plugin_names
from modelcall.testing.server import serve_kernel

pytestmark = pytest.mark.anyio


async def successes(client) -> float:
    async with client.get("/metrics") as r:
        text = await r.text()
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == "modelcall:request_success_total")


@asynccontextmanager
async def running(kernel: Kernel, tg) -> AsyncIterator[anyio.Event]:
    """Start `kernel` in a task of its own (so kernels stop in any order); set the event to stop it."""
    started, stop = anyio.Event(), anyio.Event()

    async def hold() -> None:
        async with kernel:
            started.set()
            await stop.wait()

    tg.start_soon(hold)
    await started.wait()
    try:
        yield stop
    finally:
        stop.set()


async def test_two_kernels_on_one_config_object_keep_their_own_metrics_and_ledger(tmp_path):
    db = tmp_path / "ledger.sqlite3"
    cfg = KernelConfig(**TEST_CONFIG, plugin_config={"ledger": {"path": str(db)}})
    blocked = installed_plugin_names()
    a, b = Kernel(cfg, blocked=blocked), Kernel(cfg, blocked=blocked)
    assert a.config is b.config is cfg
    async with anyio.create_task_group() as tg:
        async with running(a, tg) as stop_a, running(b, tg):
            assert a.plugin_state["metrics"] is not b.plugin_state["metrics"]
            assert a.plugin_state["ledger"] is not b.plugin_state["ledger"]
            async with serve_kernel(a) as sa, serve_kernel(b) as sb:
                ca, cb = sa.client, sb.client
                for i in range(2):
                    async with ca.post("/v1/completions", json={"prompt": f"Count {i}", "max_tokens": 2,
                                                                "temperature": 0}) as r:
                        assert r.status == 200, await r.text()
                assert await successes(ca) == 2
                assert await successes(cb) == 0
            stop_a.set()  # A stops first: B's ledger must stay open and keep recording
            while a.engine is not None:
                await anyio.sleep(0.01)
            assert "ledger" not in a.plugin_state
            done = await b.complete("Hello", max_tokens=2)
    assert b.engine is None and "ledger" not in b.plugin_state
    with open_readonly(db) as conn:
        ids = {r[0] for r in conn.execute("SELECT request_id FROM requests")}
    assert done.request_id in ids
    assert len(ids) == 3
