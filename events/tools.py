"""Tool-call fragments as they stream out of a request, in the shape OpenAI and Anthropic deltas need."""
from __future__ import annotations

import msgspec


class ToolCallDelta(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """One piece of the `index`-th tool call of a response.

    The first delta of a call carries its `id` and its complete `name` (a name is never sent
    half-done); later ones carry only `arguments` fragments. The fragments of one call
    concatenate to its arguments as a JSON object text (`"{}"` for a call without parameters).
    """

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""
