"""The llguidance constraint backend: a tokenizer view built once, a matcher per request."""
from __future__ import annotations

import json
import logging
import os
from typing import Any

from modelcall.core.constraints import ConstraintSpec
from modelcall.core.errors import InvalidRequest
from modelcall.events import StepDone, TokensEmitted
from modelcall.plugins.structured.grammar import grammar_for
from modelcall.plugins.structured.masks import GrammarProcessor, MaskPrefetcher

log = logging.getLogger("modelcall.structured")


class LLGuidanceBackend:
    """Implements `modelcall.core.constraints.ConstraintBackend` with llguidance."""

    name = "llguidance"

    def __init__(self, tokenizer: Any, model_dir: str, threads: int = 2) -> None:
        import llguidance
        import llguidance.hf

        self._ll = llguidance
        hf = getattr(tokenizer, "hf", None)
        eos = sorted(tokenizer.eos_token_ids)
        if hf is not None:
            self.tok = llguidance.hf.from_tokenizer(hf, eos_token=eos)
        else:
            path = os.path.join(model_dir, "tokenizer.json")
            with open(path, encoding="utf-8") as f:
                self.tok = llguidance.LLTokenizer(f.read(), eos_token=eos)
        self._encode = tokenizer.encode
        self.num_words = (self.tok.vocab_size + 31) // 32
        self.prefetch = MaskPrefetcher(llguidance.LLExecutor(num_threads=threads), self.num_words)

    def literal(self, text: str) -> str:
        """Fixed text as Lark: tokens the grammar engine treats as special (e.g. `<tool_call>` in
        Qwen-style vocabularies) by id, the rest as strings."""
        parts, run = [], []
        for t in self._encode(text) if text else ():
            if self.tok.is_special_token(t):
                if run:
                    parts.append(json.dumps(self.tok.decode_str(run)))
                    run = []
                parts.append(f"<[{t}]>")
            else:
                run.append(t)
        if run:
            parts.append(json.dumps(self.tok.decode_str(run)))
        return " ".join(parts)

    def logits_processor(self, spec: ConstraintSpec, request_id: str, eos_token_ids: frozenset[int]) -> GrammarProcessor:
        grammar = grammar_for(spec, self.literal)
        matcher = self._ll.LLMatcher(self.tok, grammar, log_level=0)
        if matcher.is_error():
            field = "response_format" if spec.kind == "json" else "tools"
            raise InvalidRequest(f"the constraint cannot be enforced: {matcher.get_error()}", field=field)
        p = GrammarProcessor(matcher, self.num_words, eos_token_ids, request_id)
        self.prefetch.add(p)
        return p

    def observe(self, event: Any) -> None:
        """Subscribed by the kernel to TokensEmitted, StepDone and terminal events."""
        if type(event) is TokensEmitted:
            self.prefetch.on_tokens(event.request_id, event.token_ids)
        elif type(event) is StepDone:
            self.prefetch.on_step()
        else:
            self.prefetch.on_end(event.request_id)
