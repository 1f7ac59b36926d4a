"""What the engine keeps beside each Request (its output state and the times of its stages), and the record a
finished request leaves: its Finished event, with usage (each token count by its own definition) and timings."""
from __future__ import annotations

from modelcall.core.output import OutputState
from modelcall.core.request import Request
from modelcall.events import Finished, Timings, Usage


class RequestRecord:
    """What the engine keeps beside a Request: output state and the timestamps of its stages."""

    __slots__ = ("request", "output", "received", "admitted", "scheduled", "first_token", "last_token")

    def __init__(self, request: Request, output: OutputState, received: float, admitted: float) -> None:
        self.request = request
        self.output = output
        self.received = received
        self.admitted = admitted
        self.scheduled: float | None = None
        self.first_token: float | None = None
        self.last_token: float | None = None

    def finished(self, t: float, drafted: int = 0, accepted: int = 0) -> Finished:
        """The Finished event of this record's request, ended at `t` with the finish and stop reasons already set on
        it; `drafted` / `accepted`: its speculative draft tokens. A choice of n (a fork) charges no prompt: the
        request it shares the prompt with does."""
        req, output = self.request, self.output
        shared = req.fork_of is not None
        usage = Usage(prompt_tokens=0 if shared else req.num_prompt_tokens,
                      cached_tokens=0 if shared else req.num_cached_tokens,
                      completion_tokens=req.num_output_tokens, reasoning_tokens=output.reasoning_tokens,
                      cached_disk_tokens=0 if shared else req.num_cached_disk_tokens)
        timings = Timings(received=self.received, admitted=self.admitted, scheduled=self.scheduled,
                          first_token=self.first_token, last_token=self.last_token, finished=t)
        return Finished(request_id=req.request_id, task_id=req.task_id, ts=t, reason=req.finish_reason, usage=usage,
                        timings=timings, text=output.text, stop_reason=req.stop_reason,
                        reasoning=output.reasoning_text, spec_draft_tokens=drafted, spec_accepted_tokens=accepted)
