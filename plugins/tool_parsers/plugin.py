"""Registers the built-in tool-call parsers. A parser is picked per model by `tool_parser` in the
kernel's plugin configuration, else by the markers its chat template shows."""
from __future__ import annotations

from modelcall.core.hookspecs import hookimpl
from modelcall.plugins.tool_parsers.hermes import HermesParser
from modelcall.plugins.tool_parsers.llama3 import Llama3JsonParser
from modelcall.plugins.tool_parsers.mistral import MistralParser
from modelcall.plugins.tool_parsers.pythonic import PythonicParser

PARSERS = (HermesParser, MistralParser, Llama3JsonParser, PythonicParser)


@hookimpl(trylast=True)
def register_tool_parsers(register) -> None:  # noqa: ANN001 - the host's register callable
    for cls in PARSERS:
        register(cls.name, cls, markers=cls.markers)
    register("qwen", HermesParser, markers=())  # Qwen 2.5/3 write Hermes tags
