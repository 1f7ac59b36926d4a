"""Reasoning in model output: the contract of a reasoning parser, and how the kernel picks one.

A reasoning parser splits one response's output text into reasoning (the model's thinking block)
and content, and says which output tokens are reasoning tokens. Parsers are registered by
plugins through `register_reasoning_parsers` (built-ins: modelcall.plugins.reasoning) and run
inside the core output stage, after stop strings and before tool-call markup, so a tool call
written inside reasoning stays reasoning.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from modelcall.core.errors import ConfigError

log = logging.getLogger("modelcall.reasoning")


@runtime_checkable
class ReasoningParser(Protocol):
    """Splits one response into reasoning and content. One instance serves one response.

    Promises, whatever the chunking of the text fed in:
    - the concatenation of what `feed` and `finish` return (reasoning, content) is the same as
      for feeding the whole text at once;
    - text that may still be a tag (a partial `</thi`) is held back, never leaked as content;
    - the tags themselves are in neither part.

    `is_reasoning(token_id)` is called once per output token, in order, when the token is
    sampled (its text may reach `feed` later: stop strings and partial characters hold text
    back); it returns True when that token is a reasoning token (tags included). The kernel
    sums these into `usage.reasoning_tokens`, so counting happens once, by token.

    `tags` are the markup strings the parser reads; when a tokenizer makes them special tokens,
    the output stage still shows them to the parser (never to clients).
    """

    tags: tuple[str, ...]

    def feed(self, text: str) -> tuple[str, str]:
        """Take the next piece of output text; return (reasoning, content) it decided."""
        ...

    def finish(self) -> tuple[str, str]:
        """The output ended: decide what is still held back."""
        ...

    def is_reasoning(self, token_id: int) -> bool:
        ...


ReasoningParserFactory = Callable[..., "ReasoningParser | None"]
"""`factory(tokenizer=, prompt_token_ids=, chat_template_kwargs=)` returns a fresh parser for one
chat response, or None when reasoning is off for it (e.g. `enable_thinking: false`). A factory
may take any subset of those keyword arguments."""


class ReasoningSupport:
    """The registered reasoning parsers and the model's default one (None: no reasoning split)."""

    def __init__(self, parsers: dict[str, ReasoningParserFactory], default: str | None, tokenizer: Any) -> None:
        self.parsers = parsers
        self.default = default
        self.tokenizer = tokenizer
        self._names: frozenset[str] | None = None  # the arguments the default factory takes

    @classmethod
    def assemble(cls, host: Any, config: Any, tokenizer: Any) -> ReasoningSupport:
        """Collect `register_reasoning_parsers`; the default is `plugin_config["reasoning"]["parser"]`
        ("none" turns reasoning off), else the first whose markers all appear in the chat template."""
        parsers: dict[str, ReasoningParserFactory] = {}
        markers: dict[str, tuple[str, ...]] = {}
        if hasattr(host.pm.hook, "register_reasoning_parsers"):
            for _plugin, args, kw in host.collect("register_reasoning_parsers"):
                parsers.setdefault(args[0], args[1])
                markers.setdefault(args[0], tuple(kw.get("markers", ())))
        wanted = (config.plugin_config.get("reasoning") or {}).get("parser")
        if wanted == "none":
            return cls(parsers, None, tokenizer)
        if wanted is not None and wanted not in parsers:
            raise ConfigError(f"reasoning parser {wanted!r} is not registered (have: {sorted(parsers)})")
        template = getattr(getattr(tokenizer, "hf", None), "chat_template", None) or ""
        default = wanted or next((n for n, m in markers.items() if m and all(x in template for x in m)), None)
        log.info("reasoning parser: %s", default)
        return cls(parsers, default, tokenizer)

    def open(self, prompt_token_ids: Sequence[int], chat_template_kwargs: dict | None) -> ReasoningParser | None:
        """A parser for one chat response, or None (no parser for this model, or reasoning off)."""
        if self.default is None:
            return None
        factory = self.parsers[self.default]
        if self._names is None:
            self._names = _accepted(factory)
        kwargs = {"tokenizer": self.tokenizer, "prompt_token_ids": prompt_token_ids,
                  "chat_template_kwargs": dict(chat_template_kwargs or {})}
        return factory(**{k: v for k, v in kwargs.items() if k in self._names})


def _accepted(fn: Callable[..., Any]) -> frozenset[str]:
    """The factory arguments `fn` names (factories may take any subset of them)."""
    import inspect

    every = frozenset({"tokenizer", "prompt_token_ids", "chat_template_kwargs"})
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return every
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return every
    return every & frozenset(params)
