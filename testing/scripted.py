"""A sampler that makes the model say what a test wants: deterministic output for output-stage plugins.

    sampler = ScriptedSampler()
    async with make_kernel(plugins=[sampler, my_filter]) as kernel:
        sampler.say(kernel.tokenizer.encode("the secret is 42"))
        done = await kernel.complete("hi", max_tokens=32)
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from modelcall.core import hookimpl


class ScriptedSampler:
    """A `Sampler` plugin (asked first) that emits a script of token ids, then an end-of-sequence token.

    `say(ids)` sets the script of every request; `say(ids, request_id=...)` of one. Requests
    without a script are sampled greedily from the real logits.
    """

    modelcall_plugin_name = "modelcall.testing.scripted_sampler"

    def __init__(self) -> None:
        self.default: list[int] | None = None
        self.scripts: dict[str, list[int]] = {}

    @hookimpl(tryfirst=True)
    def provide_sampler(self) -> ScriptedSampler:
        return self

    def say(self, token_ids: Sequence[int], request_id: str | None = None) -> None:
        if request_id is None:
            self.default = list(token_ids)
        else:
            self.scripts[request_id] = list(token_ids)

    def sample(self, logits: Any, chunks: Sequence[Any]) -> tuple[list[int], None]:
        out = []
        for i, chunk in enumerate(chunks):
            req = chunk.request
            script = self.scripts.get(req.request_id, self.default)
            n = req.num_output_tokens
            if script is None:
                out.append(int(logits[i].argmax()))
            elif n < len(script):
                out.append(script[n])
            else:  # the script is over: end the request (or repeat the last token when no EOS is known)
                out.append(min(req.eos_token_ids) if req.eos_token_ids else script[-1])
        return out, None
