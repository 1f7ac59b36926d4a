"""One codec for every event: JSON for logs and SSE, msgpack for the wire between processes."""
from __future__ import annotations

import msgspec

from modelcall.events.types import AnyEvent

_json_enc = msgspec.json.Encoder()
_json_dec = msgspec.json.Decoder(AnyEvent)
_mp_enc = msgspec.msgpack.Encoder()
_mp_dec = msgspec.msgpack.Decoder(AnyEvent)


def to_json(event: AnyEvent) -> bytes:
    return _json_enc.encode(event)


def from_json(data: bytes | str) -> AnyEvent:
    return _json_dec.decode(data)


def to_msgpack(event: AnyEvent) -> bytes:
    return _mp_enc.encode(event)


def from_msgpack(data: bytes) -> AnyEvent:
    return _mp_dec.decode(data)


def to_builtins(event: AnyEvent) -> dict:
    """The event as plain dicts and lists (tag included), for templating and tests."""
    return msgspec.to_builtins(event)
