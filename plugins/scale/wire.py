"""What crosses Ray between the front end and a replica: msgpack bytes, never pickled objects.

front end ── Call ──▶ replica          (one submit or count)
front end ◀── Admitted | Refused ──     (the entry pipeline's answer, first item of the stream)
front end ◀── event, event, …  ──     (modelcall.events codec: the request's events, as on one kernel)
front end ── load / unload ──▶ each replica, ◀── Adapter | Refused   (runtime LoRA, remote_loras.py)
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from modelcall.core import errors
from modelcall.core.metering import Caller
from modelcall.core.submit import Choice, GenerateRequest
from modelcall.events.codec import Codec


class Call(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """One `Kernel.submit_choice` (or `count_tokens`) as data: the typed request (its id set), where it
    stands among its call's choices, and the Exchange's fields (the caller the front end authenticated)."""

    request: GenerateRequest
    choice: Choice = Choice()
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


class Adapter(msgspec.Struct, tag=True, kw_only=True, gc=False):
    """A LoRA adapter a replica loaded (or unloaded): core.lora.LoraInfo's fields."""

    name: str
    path: str
    rank: int | None = None
    targets: list[str] = []


Reply = Admitted | Counted | Refused | Adapter
CALLS: Codec[Call] = Codec(Call)
REPLIES: Codec[Reply] = Codec(Reply)
encode: Callable[[Call | Reply], bytes] = CALLS.to_msgpack  # the one msgpack encoder: it takes either
decode_call = CALLS.from_msgpack
decode_reply = REPLIES.from_msgpack


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
