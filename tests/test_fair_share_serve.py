"""`--scheduling fair` end to end: a server with two API keys, one tenant sending a backlog and the
other one request, through the openai SDK. The light tenant's request is admitted at the first free
slot, not behind the backlog; the scheduler's counters name the keys, weighted as the key file says."""
from __future__ import annotations

import threading
import time

import openai
import pytest
from http_server import ServerThread
from keys_util import write_keys

pytestmark = pytest.mark.slow   # ~15 s on a loaded machine; tests/test_fair_share.py holds the fast checks

HEAVY, LIGHT = "mc-heavy-tenant", "mc-light-tenant"


def test_a_light_tenant_is_served_before_a_heavy_tenants_backlog(tmp_path):
    keys = write_keys(tmp_path / "keys.toml", {HEAVY: {"name": "heavy"}, LIGHT: {"name": "light", "weight": 2.0}})
    done: dict[str, float] = {}

    def ask(client: openai.OpenAI, label: str, max_tokens: int) -> None:
        client.completions.create(model="demo-model-1", prompt="fair share " * 20, max_tokens=max_tokens,
                                  temperature=0, extra_body={"ignore_eos": True})
        done[label] = time.monotonic()

    with ServerThread(plugin_config={"auth": {"api_keys": str(keys)}}, scheduling_policy="fair",
                      max_num_seqs=2) as server:
        def client(key: str) -> openai.OpenAI:  # made before the clock matters (its set-up is not the server's)
            return openai.OpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0)

        heavy = [threading.Thread(target=ask, args=(client(HEAVY), f"heavy{i}", 48)) for i in range(6)]
        light = threading.Thread(target=ask, args=(client(LIGHT), "light", 4))
        for t in heavy:
            t.start()
        while server.stats()["running"] < 2 or server.stats()["waiting"] < 4:   # the backlog is in
            time.sleep(0.005)
        light.start()
        for t in [*heavy, light]:
            t.join(120)
        order = sorted(done, key=done.get)
        assert len(order) == 7 and order.index("light") <= 2, order   # after the two running; fcfs: last
        counters = server.call(lambda: server.kernel.scheduler.waiting.stats()["counters"])
    assert set(counters) == {"heavy", "light"} and counters["heavy"] > counters["light"] > 0
