"""Prometheus metrics under `modelcall:` (vLLM's names where they exist), one registry per kernel."""
