"""`Server-Timing` for whole responses: where the request's time went on the server, so a client
(the agent runtime) can record queue, prefill and decode time measured where they happened."""
from __future__ import annotations

from modelcall.events import Finished


def server_timing(ev: Finished | None) -> dict[str, str]:
    """The header for one finished request (milliseconds), or no header."""
    if ev is None:
        return {}
    t = ev.timings
    spans = (("queue", t.queue_s), ("prefill", t.prefill_s), ("decode", t.decode_s), ("e2e", t.e2e_s))
    parts = [f"{name};dur={s * 1e3:.2f}" for name, s in spans if s is not None]
    return {"Server-Timing": ", ".join(parts)} if parts else {}
