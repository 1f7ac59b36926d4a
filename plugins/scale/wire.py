"""What crosses Ray between the front end and a replica: msgpack bytes, never pickled objects.

front end ── Call ──▶ replica          (one submit or count)
front end ◀── Admitted | Refused ──     (the entry pipeline's answer, first item of the stream)
front end ◀── event, event, …  ──     (modelcall.events codec: the request's events, as on one kernel)
"""
from __future__ import annotations

from typing import Any

import msgspec

from modelcall.core import errors
from modelcall.core.metering import Caller
from modelcall.core.params import SamplingParams


class Call(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """One `Kernel.submit` (or `count_tokens`) as data: its plain keyword arguments, the sampling
    params, and the Exchange's fields (the caller the front end authenticated)."""

    request_id: str
    fields: dict[str, Any] = {}
    params: SamplingParams | None = None
    caller: Caller | None = None
    task_id: str | None = None
    context_policy: str | None = None
    retries: int = 0
    client: str | None = None


class Admitted(msgspec.Struct, tag=True, kw_only=True, gc=False):
    replica: str
    prompt_token_ids: list[int]
    context: dict | None = None
    prompt_parts: dict | None = None


class Counted(msgspec.Struct, tag=True, kw_only=True, gc=False):
    replica: str
    tokens: int


class Refused(msgspec.Struct, tag=True, kw_only=True, gc=False):
    """A ModelcallError raised by the replica's entry pipeline, rebuilt as the same class here."""

    error: str
    message: str
    attrs: dict[str, Any] = {}


Reply = Admitted | Counted | Refused
_enc = msgspec.msgpack.Encoder()
_call_dec = msgspec.msgpack.Decoder(Call)
_reply_dec = msgspec.msgpack.Decoder(Reply)


def encode(obj: Any) -> bytes:
    return _enc.encode(obj)


def decode_call(data: bytes) -> Call:
    return _call_dec.decode(data)


def decode_reply(data: bytes) -> Reply:
    return _reply_dec.decode(data)


def refusal(e: errors.ModelcallError) -> Refused:
    plain = {k: v for k, v in vars(e).items() if isinstance(v, (str, int, float, bool, type(None), dict, list))}
    return Refused(error=type(e).__name__, message=str(e), attrs=plain)


def rebuild(r: Refused) -> errors.ModelcallError:
    """The refusal as the kernel's own error class (status, field, retry_after kept), so the front
    end answers it exactly as it would on one kernel."""
    cls = getattr(errors, r.error, None)
    if not (isinstance(cls, type) and issubclass(cls, errors.ModelcallError)):
        cls = errors.ModelcallError
    e = cls.__new__(cls)
    Exception.__init__(e, r.message)
    vars(e).update(r.attrs)
    return e
