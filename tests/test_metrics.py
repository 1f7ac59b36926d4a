"""`GET /metrics`: Prometheus text that prometheus-client's own parser reads, counters equal to the requests made.

Names follow vLLM's under `modelcall:`; every kernel has its own registry (two kernels in one
process never mix their numbers).
"""
from __future__ import annotations

import time

import httpx2 as httpx
import pytest
from http_server import ServerThread
from prometheus_client.parser import text_string_to_metric_families

from modelcall.events import Finished, Preempted, TokensEmitted, Timings, Usage
from modelcall.plugins.metrics.metrics import KernelMetrics

VLLM_NAMES = ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
              "request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
              "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prefix_cache_queries",
              "prefix_cache_hits", "num_preemptions", "prompt_tokens", "generation_tokens", "request_success")


def scrape(base: str) -> dict[str, dict[tuple, float]]:
    """sample name -> {labels (sorted items): value}, through prometheus-client's parser."""
    text = httpx.get(base + "/metrics").text
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    db = tmp_path_factory.mktemp("m") / "ledger.sqlite3"
    with ServerThread(plugin_config={"ledger": {"path": str(db)}}) as s:
        yield s


def test_metrics_parse_and_count_the_requests_made(server):
    base = server.base_url
    model = httpx.get(base + "/v1/models").json()["data"][0]["id"]
    before = scrape(base)
    prompt = completion = 0
    n = 5
    for i in range(n):
        b = httpx.post(base + "/v1/chat/completions", json={
            "model": model, "messages": [{"role": "user", "content": f"Say {i}."}], "max_tokens": 3 + i,
            "temperature": 0, "ignore_eos": True}).json()
        prompt += b["usage"]["prompt_tokens"]
        completion += b["usage"]["completion_tokens"]
    r = httpx.post(base + "/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "x"}],
                                                         "max_tokens": 10**6})
    assert r.status_code == 400
    lab = (("model_name", model),)
    success = (("finished_reason", "length"), ("model_name", model))

    def delta(name: str, labels: tuple = lab) -> float:
        return after.get(name, {}).get(labels, 0.0) - before.get(name, {}).get(labels, 0.0)

    # NOTE: observers run after the step that answered; wait for the counts, not for a fixed time
    deadline = time.monotonic() + 30
    after = scrape(base)
    while delta("modelcall:request_success_total", success) < n and time.monotonic() < deadline:
        time.sleep(0.01)
        after = scrape(base)

    for name in VLLM_NAMES:
        assert any(k == "modelcall:" + name or k.startswith("modelcall:" + name + "_") for k in after), name
    assert delta("modelcall:request_success_total", success) == n
    assert delta("modelcall:prompt_tokens_total") == prompt
    assert delta("modelcall:generation_tokens_total") == completion
    for h in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
              "request_prefill_time_seconds", "request_decode_time_seconds"):
        assert delta(f"modelcall:{h}_count") == n, h
    # Each request's tokens after the first are one inter-token gap each.
    assert delta("modelcall:inter_token_latency_seconds_count") == completion - n
    assert delta("modelcall:request_rejected_total", (("model_name", model), ("status", "400"))) == 1
    assert after["modelcall:num_requests_running"][lab] == 0
    assert after["modelcall:num_requests_waiting"][lab] == 0
    assert 0.0 <= after["modelcall:kv_cache_usage_perc"][lab] <= 1.0
    assert after["modelcall:prefix_cache_queries_total"][lab] >= after["modelcall:prefix_cache_hits_total"][lab] >= 0
    drops = after["modelcall:observer_dropped_events_total"]
    assert drops[(("model_name", model), ("observer", "ledger"))] == 0


def test_each_kernel_has_its_own_registry():
    a, b = KernelMetrics(), KernelMetrics()
    for m in (a, b):
        m.bind("m")
    fin = Finished(request_id="r", reason="stop", usage=Usage(prompt_tokens=2, completion_tokens=3),
                   timings=Timings(received=0.0, admitted=0.1, scheduled=0.2, first_token=0.3, last_token=0.5,
                                   finished=0.5))
    a.on_tokens(TokensEmitted(request_id="r", ts=0.3, token_ids=(1,), text="a"))
    a.on_tokens(TokensEmitted(request_id="r", ts=0.4, token_ids=(2,), text="b"))
    a.on_finished(fin)
    a.on_preempted(Preempted(request_id="r", recompute_tokens=1))
    ta, tb = a.exposition().decode(), b.exposition().decode()
    assert 'modelcall:generation_tokens_total{model_name="m"} 3.0' in ta
    assert 'modelcall:generation_tokens_total{model_name="m"} 0.0' in tb
    assert 'modelcall:num_preemptions_total{model_name="m"} 1.0' in ta
    assert 'modelcall:inter_token_latency_seconds_count{model_name="m"} 1.0' in ta


def test_observers_take_microseconds():
    m = KernelMetrics()
    m.bind("m")
    evs = [TokensEmitted(request_id=f"r{i % 32}", ts=float(i), token_ids=(1,), text="x") for i in range(500)]

    def per_event(fn) -> float:
        t0 = time.perf_counter()
        for ev in evs:
            fn(ev)
        return (time.perf_counter() - t0) / len(evs)

    # NOTE: against the least a token observer must do, one histogram observation, timed in turns with it:
    # the best of 40 turns each is steady on a loaded machine where one long timing is not. Measured 1.5x
    # (0.9 µs per event, Zen 3); the bound is generous, 5x, so only real per-token work fails it (a lookup
    # of labelled children, a second histogram, a lock: each a few observations' worth).
    least = lambda ev: m.itl.observe(0.01)  # noqa: E731
    rounds = [(per_event(least), per_event(m.on_tokens)) for _ in range(40)]
    floor, per = min(r[0] for r in rounds), min(r[1] for r in rounds)
    print(f"{per * 1e6:.2f} µs per token event, {per / floor:.2f}x one histogram observation")
    assert per <= 5 * floor, f"{per * 1e6:.2f} µs per token event, {per / floor:.1f}x one histogram observation"
