"""Tools in modelcall core, one file a stage:

- `parser.py`  the tool-call parser contract (`ToolParser`) and the per-request stream the output
               stage runs it in (`ToolCallStream`): model output -> `ToolCall`s and `ToolRequested`;
- `typed.py`   tools as typed Python functions (`Tool`, `@tool`): the app-side agent runtime's and
               the server-hosted tools' shared form;
- `server.py`  the server-hosted tool contract (`ServerToolbox`) between the Responses front end and
               the plugin that hosts the tools;
- `support.py` the kernel's use of them: the parser and constraint a request gets before admission.

Plugins import from here (`from modelcall.core.tools import ToolParser, tool`); `support` is the
kernel's own and is not re-exported (it imports core/constraints.py, which imports this package).
"""
from modelcall.core.tools.parser import (
    ParsedOutput, ParserDelta, ToolCall, ToolCallFormat, ToolCallStream, ToolParser, ToolParserFactory,
    default_call_id,
)
from modelcall.core.tools.server import (
    SEPARATOR, TOOLBOX_KEY, ServerToolbox, ServerToolInfo, ToolOutcome, qualified_name, toolbox_of,
)
from modelcall.core.tools.typed import Tool, schema_of, tool

__all__ = [
    "SEPARATOR", "TOOLBOX_KEY", "ParsedOutput", "ParserDelta", "ServerToolInfo", "ServerToolbox", "Tool", "ToolCall",
    "ToolCallFormat", "ToolCallStream", "ToolOutcome", "ToolParser", "ToolParserFactory", "default_call_id",
    "qualified_name", "schema_of", "tool", "toolbox_of",
]
