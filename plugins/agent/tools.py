"""Tools as typed Python functions (the agent runtime's name for them); they live in core
(`modelcall.core.typed_tools`) because server-hosted tools are the same functions."""
from __future__ import annotations

from modelcall.core.typed_tools import Tool, schema_of, tool

__all__ = ["Tool", "schema_of", "tool"]
