"""events/codec.py's Codec: JSON and msgpack both ways for one type, the decoders checking what they
decode; the events' functions are one such codec and the scale wire's calls and replies another."""
from __future__ import annotations

import msgspec
import pytest

from modelcall.events import TokensEmitted, from_json, from_msgpack, to_json, to_msgpack
from modelcall.events.codec import Codec
from modelcall.plugins.scale import wire


class Point(msgspec.Struct, frozen=True):
    x: int
    y: int


def test_a_codec_round_trips_its_type_both_ways_and_refuses_another():
    codec: Codec[Point] = Codec(Point)
    p = Point(3, 4)
    assert codec.from_json(codec.to_json(p)) == p and codec.from_msgpack(codec.to_msgpack(p)) == p
    with pytest.raises(msgspec.ValidationError):
        codec.from_msgpack(codec.to_msgpack({"x": "three", "y": 4}))
    with pytest.raises(msgspec.ValidationError):
        codec.from_json(b'{"x": 3}')


def test_the_events_codec_picks_the_class_by_its_tag_and_refuses_a_non_event():
    ev = TokensEmitted(request_id="r1", token_ids=(5, 6), text="hi")
    assert from_json(to_json(ev)) == ev and type(from_msgpack(to_msgpack(ev))) is TokensEmitted
    with pytest.raises(msgspec.ValidationError):
        from_msgpack(to_msgpack(Point(1, 2)))
    assert to_msgpack.__self__ is wire.encode.__self__  # one msgpack encoder for events, calls and replies


def test_the_wire_decodes_replies_by_tag_and_a_call_is_not_a_reply():
    for reply in (wire.Counted(replica="a", tokens=7), wire.Refused(error="Overloaded", message="full"),
                  wire.Admitted(replica="a", prompt_token_ids=[1, 2])):
        assert wire.decode_reply(wire.encode(reply)) == reply
    with pytest.raises(msgspec.ValidationError):
        wire.decode_reply(to_msgpack(TokensEmitted(request_id="r1", token_ids=(5,), text="a")))
