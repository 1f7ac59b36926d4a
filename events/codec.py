"""One codec for every event: JSON for logs and SSE, msgpack for the wire between processes.

`Codec` is that pair for one type; the events' module functions below are one, and any other message
that crosses a process (plugins/scale/wire.py: calls and replies) is another, so both ends of every
boundary encode with the same encoders.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgspec

from modelcall.events.types import AnyEvent

T = TypeVar("T")

# NOTE: an encoder takes any type; only decoders are per type (they check what they decode).
_json_enc = msgspec.json.Encoder()
_mp_enc = msgspec.msgpack.Encoder()


class Codec(Generic[T]):
    """JSON and msgpack, both ways, for `kind`: a Struct, or a union of tagged Structs. The four are the
    msgspec encoders' and decoders' own methods, so a call costs no Python frame of ours."""

    __slots__ = ("from_json", "from_msgpack", "to_json", "to_msgpack")

    def __init__(self, kind: Any) -> None:
        self.to_json: Callable[[T], bytes] = _json_enc.encode
        self.from_json: Callable[[bytes | str], T] = msgspec.json.Decoder(kind).decode
        self.to_msgpack: Callable[[T], bytes] = _mp_enc.encode
        self.from_msgpack: Callable[[bytes], T] = msgspec.msgpack.Decoder(kind).decode


EVENTS: Codec[AnyEvent] = Codec(AnyEvent)
to_json = EVENTS.to_json            # event -> JSON bytes
from_json = EVENTS.from_json        # JSON -> the event it encodes (its "type" tag picks the class)
to_msgpack = EVENTS.to_msgpack      # event -> msgpack bytes
from_msgpack = EVENTS.from_msgpack  # msgpack -> event


def to_builtins(event: AnyEvent) -> dict:
    """The event as plain dicts and lists (tag included), for templating and tests."""
    return msgspec.to_builtins(event)
