"""Tools as typed Python functions (the agent runtime's name for them); they live in core
(`modelcall.core.tools`) because server-hosted tools are the same functions."""
from __future__ import annotations

from modelcall.core.tools import Tool, schema_of, tool

__all__ = ["Tool", "schema_of", "tool"]
