"""Events: frozen typed structs, one codec for JSON and msgpack, and a bus that never blocks the engine."""
import msgspec
import pytest

from modelcall.events import (
    EventBus, Finished, OffloadedObserver, RequestAdmitted, RequestStream, StepDone, Timings,
    TokensEmitted, Usage, from_json, from_msgpack, to_json, to_msgpack,
)

pytestmark = pytest.mark.anyio


def _delta(rid: str, i: int) -> TokensEmitted:
    return TokensEmitted(request_id=rid, token_ids=(i,), text=f"<{i}>")


def test_events_round_trip_through_json_and_msgpack_as_the_same_object():
    fin = Finished(request_id="r1", task_id="t", reason="stop", usage=Usage(prompt_tokens=3, completion_tokens=2),
                   timings=Timings(received=1.0, admitted=1.1, scheduled=1.2, first_token=1.5, last_token=2.0,
                                   finished=2.0), text="hi")
    for ev in (fin, _delta("r1", 7), StepDone(step=1, num_tokens=4, num_requests=2, num_waiting=0, num_running=2,
                                             kv_usage=0.1, schedule_s=1e-5, forward_s=1e-3, step_s=2e-3)):
        assert from_json(to_json(ev)) == ev
        assert from_msgpack(to_msgpack(ev)) == ev
    assert b'"type":"Finished"' in to_json(fin)
    assert fin.timings.queue_s == pytest.approx(0.1) and fin.timings.ttft_s == pytest.approx(0.5)
    assert fin.usage.total_tokens == 5


def test_events_are_frozen_and_timestamped_where_created():
    a = RequestAdmitted(request_id="r", model="m", prompt_tokens=1, max_tokens=2)
    b = RequestAdmitted(request_id="r", model="m", prompt_tokens=1, max_tokens=2)
    assert b.ts >= a.ts > 0
    with pytest.raises(AttributeError):
        a.prompt_tokens = 5  # type: ignore[misc]


def test_observers_are_frozen_per_type_and_a_raising_one_is_counted_not_fatal():
    bus = EventBus()
    seen, every = [], []
    bus.subscribe(TokensEmitted, seen.append)
    bus.subscribe(msgspec.Struct, every.append, name="all")

    def broken(ev):
        raise RuntimeError("boom")

    bus.subscribe(RequestAdmitted, broken, name="broken")
    bus.freeze()
    with pytest.raises(RuntimeError):
        bus.subscribe(TokensEmitted, seen.append)
    bus.publish([RequestAdmitted(request_id="r", model="m", prompt_tokens=1, max_tokens=1), _delta("r", 1)])
    assert [type(e) for e in seen] == [TokensEmitted]
    assert len(every) == 2
    assert bus.observer_errors["broken"] == 1


async def test_a_lagging_consumer_gets_deltas_merged_never_dropped():
    stream = RequestStream("r", capacity=4)
    for i in range(100):
        stream.put(_delta("r", i))
    stream.put(Finished(request_id="r", reason="length", usage=Usage(), timings=Timings(received=0.0)))
    got = [ev async for ev in stream]
    deltas = [e for e in got if isinstance(e, TokensEmitted)]
    assert len(got) <= 5 and isinstance(got[-1], Finished)
    assert [t for d in deltas for t in d.token_ids] == list(range(100))
    assert "".join(d.text for d in deltas) == "".join(f"<{i}>" for i in range(100))
    assert stream.merged == 96


async def test_bus_routes_request_events_to_their_stream_and_forgets_it_at_the_end():
    bus = EventBus()
    bus.freeze()
    s1, s2 = bus.open_stream("a"), bus.open_stream("b")
    bus.publish([_delta("a", 1), _delta("b", 2),
                 Finished(request_id="a", reason="stop", usage=Usage(), timings=Timings(received=0.0))])
    assert bus.stream("a") is None and bus.stream("b") is s2
    assert [type(e).__name__ async for e in s1] == ["TokensEmitted", "Finished"]


def test_offloaded_observer_drops_and_counts_when_its_queue_is_full():
    import threading
    gate = threading.Event()
    handled = []

    def slow(ev):
        gate.wait(5)
        handled.append(ev)

    obs = OffloadedObserver(slow, maxsize=2, name="slow")
    for i in range(10):
        obs(i)  # never blocks
    gate.set()
    obs.flush()
    assert obs.dropped >= 7 and len(handled) + obs.dropped == 10
    obs.close()
