"""What the kernel does for tools and structured output: pick the model's tool-call parser, build a
request's constraint, and hand both to the request (a parser stream for the output stage, logits
processors for the sampler). Assembled once at start-up from the plugins."""
from __future__ import annotations

import logging
from typing import Any

from modelcall.core.constraints import ConstraintBackend, spec_for_response_format, spec_for_tools
from modelcall.core.errors import InvalidRequest
from modelcall.core.tools import ToolCallStream, ToolParserFactory, default_call_id
from modelcall.events import TERMINAL_EVENTS, EventBus, StepDone, TokensEmitted

log = logging.getLogger("modelcall.tools")


class Prepared:
    """One request's tool-call stream and logits processors, decided before it is admitted."""

    __slots__ = ("stream", "processors")

    def __init__(self, stream: ToolCallStream | None, processors: list[Any]) -> None:
        self.stream = stream
        self.processors = processors


class ToolSupport:
    """The registered tool-call parsers, the model's default one, and the constraint backend."""

    def __init__(self, parsers: dict[str, tuple[ToolParserFactory, tuple[str, ...]]], default: str | None,
                 backend: ConstraintBackend | None) -> None:
        self.parsers = parsers
        self.default = default
        self.backend = backend

    @classmethod
    def assemble(cls, host: Any, config: Any, tokenizer: Any, model_dir: str, bus: EventBus) -> ToolSupport:
        """Collect `register_tool_parsers`; the default parser is `plugin_config["tools"]["parser"]`,
        else the first whose markers appear in the chat template; the backend is whatever
        `provide_constraint_backend` returns (None: constrained decoding unavailable). A backend
        with `observe` is subscribed to `bus` (before it freezes) to see tokens as they land."""
        parsers: dict[str, tuple[ToolParserFactory, tuple[str, ...]]] = {}
        for _plugin, args, kw in host.collect("register_tool_parsers"):
            parsers.setdefault(args[0], (args[1], tuple(kw.get("markers", ()))))
        wanted = (config.plugin_config.get("tools") or {}).get("parser")
        if wanted is not None and wanted not in parsers:
            raise InvalidRequest(f"tool parser {wanted!r} is not registered (have: {sorted(parsers)})", field="parser")
        template = getattr(getattr(tokenizer, "hf", None), "chat_template", None) or ""
        default = wanted or next((name for name, (_f, marks) in parsers.items()
                                  if any(m in template for m in marks)), None)
        backend = None
        if hasattr(host.pm.hook, "provide_constraint_backend"):
            backend = host.pm.hook.provide_constraint_backend(config=config, tokenizer=tokenizer, model_dir=model_dir)
        if backend is not None and hasattr(backend, "observe"):
            bus.subscribe((TokensEmitted, StepDone, *TERMINAL_EVENTS), backend.observe, f"{backend.name}.observe")
        log.info("tool parser: %s; constraint backend: %s", default, getattr(backend, "name", None))
        return cls(parsers, default, backend)

    def parser_factory(self, name: str | None) -> ToolParserFactory | None:
        name = name or self.default
        if name is None:
            return None
        if name not in self.parsers:
            raise InvalidRequest(f"unknown tool parser {name!r} (have: {sorted(self.parsers)})", field="tool_parser")
        return self.parsers[name][0]

    def prepare(self, *, request_id: str, task_id: str | None, eos_token_ids: frozenset[int],
                tools: list[dict] | None, tool_choice: Any, response_format: Any,
                parallel_tool_calls: bool | None, tool_parser: str | None,
                logits_processors: Any = ()) -> Prepared | None:
        """Validate the request's tool and format options; raise InvalidRequest naming the field."""
        processors = list(logits_processors or ())
        want_calls = bool(tools) and tool_choice != "none"
        factory = self.parser_factory(tool_parser) if want_calls or tool_parser else None
        if want_calls and factory is None:
            raise InvalidRequest("this model has no tool-call parser; configure plugin_config "
                                 "{'tools': {'parser': NAME}} or send tool_choice 'none'", field="tools")
        parser = factory(default_call_id(request_id)) if factory is not None else None
        spec = spec_for_tools(tools, tool_choice, parallel_tool_calls, getattr(parser, "call_format", None)) \
            if tools or tool_choice not in (None, "none", "auto") else None
        spec = spec or spec_for_response_format(response_format)
        if spec is not None:
            if self.backend is None:
                raise InvalidRequest("constrained decoding is not available: no plugin provides a constraint "
                                     "backend (install llguidance)", field="response_format")
            processors.append(self.backend.logits_processor(spec, request_id, eos_token_ids))
        stream = ToolCallStream(parser, request_id, task_id) if parser is not None and want_calls else None
        if stream is None and not processors:
            return None
        return Prepared(stream, processors)
