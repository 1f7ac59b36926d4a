"""What the Ray path of tenancy needs, checked without Ray (tests/test_scale_ray.py runs it for real,
slow tier): a caller's limits cross to a replica as limits the quota meters read, and the replicas'
quota-store gauges appear on the front end's one /metrics under their own names, one per replica."""
from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from modelcall.core.errors import Overloaded
from modelcall.core.metering import Admission, Caller
from modelcall.core.quota_store import QuotaLimits
from modelcall.core.submit import GenerateRequest
from modelcall.plugins.auth.shared_quota import SharedQuotaBook
from modelcall.plugins.auth.store_local import LocalQuotaStore
from modelcall.plugins.scale import wire
from modelcall.plugins.scale.series import ReplicaSeries


def test_a_callers_limits_reach_a_replica_as_limits_its_quota_meter_applies():
    sent = Caller(name="tenant", limits=QuotaLimits(rpm=1, daily_tokens=900))
    got = wire.decode_call(wire.encode(wire.Call(request=GenerateRequest.of(prompt="hi"), caller=sent))).caller
    assert got == sent and got.limits.rpm == 1
    book = SharedQuotaBook(LocalQuotaStore())   # what a replica's meter does with it
    book.reserve(admission("r1", got))
    with pytest.raises(Overloaded, match="1 requests per minute"):
        book.reserve(admission("r2", got))


def admission(request_id: str, caller: Caller) -> Admission:
    return Admission(request_id=request_id, task_id=None, model="m", caller=caller, prompt_tokens=4, max_tokens=4)


def test_each_replicas_quota_gauges_are_on_the_front_ends_metrics_by_replica():
    up, down = SharedQuotaBook(LocalQuotaStore(), fail="open"), SharedQuotaBook(LocalQuotaStore(), fail="open")
    down.up, down.errors = False, 2          # as after two failed calls (the local store has no ping)
    stats = {"r-a": {"meter_gauges": up.gauges()}, "r-b": {"meter_gauges": down.gauges()}}
    text = ReplicaSeries().exposition("m", stats).decode()
    samples = {(s.name, s.labels["replica"]): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples if "replica" in s.labels}
    assert samples[("modelcall:quota_store_up", "r-a")] == 1.0 and samples[("modelcall:quota_store_up", "r-b")] == 0.0
    assert samples[("modelcall:quota_store_fail_open", "r-b")] == 1.0
    assert samples[("modelcall:quota_store_errors", "r-b")] == 2.0
