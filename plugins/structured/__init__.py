"""Constrained decoding with llguidance: JSON (response_format) and forced tool calls (tool_choice)."""
