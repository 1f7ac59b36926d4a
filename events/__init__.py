"""modelcall.events: the typed events of a model call, their codec and the bus that carries them."""
from modelcall.events.bus import EventBus, Observer
from modelcall.events.codec import from_json, from_msgpack, to_builtins, to_json, to_msgpack
from modelcall.events.offload import OffloadedObserver
from modelcall.events.stream import RequestStream, merge_deltas
from modelcall.events.tools import ToolCallDelta
from modelcall.events.types import (
    REQUEST_EVENTS, TERMINAL_EVENTS, AnyEvent, Event, Finished, PositionLogprobs, Preempted,
    PrefillDone, PromptLogprobs, Pooled, RequestAdmitted, RequestFailed, RequestQueued, RequestRejected, RequestScheduled,
    ResponseSent, StepDone, Timings, TokenLogprob, TokensEmitted, ToolExecuted, ToolFailed, ToolRequested, Usage,
    now,
)

__all__ = [
    "REQUEST_EVENTS", "TERMINAL_EVENTS", "AnyEvent", "Event", "EventBus", "Finished", "Observer",
    "OffloadedObserver", "PositionLogprobs", "Pooled", "Preempted", "PrefillDone", "PromptLogprobs", "RequestAdmitted",
    "RequestFailed", "RequestQueued", "RequestRejected", "RequestScheduled", "RequestStream", "ResponseSent",
    "StepDone", "Timings", "TokenLogprob", "TokensEmitted", "ToolCallDelta", "ToolExecuted", "ToolFailed",
    "ToolRequested", "Usage", "from_json", "from_msgpack", "merge_deltas", "now", "to_builtins",
    "to_json", "to_msgpack",
]
