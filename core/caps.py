"""The entry stage's caps: bounds one call may not exceed, each a KernelConfig setting, each a 400
that names the field, the number sent and the setting (so one call cannot fill the queue)."""
from __future__ import annotations

from typing import Any

from modelcall.core.errors import InvalidRequest
from modelcall.core.params import SamplingParams


def check_caps(config: Any, messages: list | None, tools: list | None, params: SamplingParams,
               admitted: int, sequences: int) -> None:
    """`admitted`: sequences already started for this client call; `sequences`: those this one adds."""
    if messages is not None and len(messages) > config.max_messages:
        raise InvalidRequest(f"{len(messages)} messages is over the limit of {config.max_messages} per request "
                             "(max_messages)", field="messages")
    if tools is not None and len(tools) > config.max_tools:
        raise InvalidRequest(f"{len(tools)} tools is over the limit of {config.max_tools} per request (max_tools)",
                             field="tools")
    if len(params.stop) > config.max_stop_strings:
        raise InvalidRequest(f"{len(params.stop)} stop strings is over the limit of {config.max_stop_strings} "
                             "(max_stop_strings)", field="stop")
    longest = max((len(s) for s in params.stop), default=0)
    if longest > config.max_stop_length:
        raise InvalidRequest(f"a stop string of {longest} characters is over the limit of {config.max_stop_length} "
                             "(max_stop_length)", field="stop")
    if admitted + sequences > config.max_sequences_per_call:
        raise InvalidRequest(f"this call asks for {admitted + sequences} sequences (prompts × n) but one call may "
                             f"start at most {config.max_sequences_per_call} (max_sequences_per_call); send fewer "
                             "prompts or a smaller n", field="n")
