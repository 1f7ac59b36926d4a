"""Plugin module registering `modelcall bench` (entry point `bench`)."""
from __future__ import annotations

from typing import Any

from modelcall.core import hookimpl


@hookimpl
def register_commands(register: Any) -> None:
    from modelcall.plugins.bench import serve, throughput
    # `bench` is a command group: other plugins may join it with "bench NAME".
    register("bench throughput", "offline throughput of a JSONL workload (all rows at once, greedy)",
             throughput.configure, throughput.run)
    register("bench serve", "load an OpenAI-compatible server with streaming clients (TTFT, ITL, throughput)",
             serve.configure, serve.run)
