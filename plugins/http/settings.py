"""Settings of the HTTP front end (the kernel has its own KernelConfig)."""
from __future__ import annotations

import msgspec


class ServerSettings(msgspec.Struct, kw_only=True):
    host: str = "127.0.0.1"
    port: int = 8000
    max_body_bytes: int = 16 * 2**20     # larger bodies get 413 before they are read
    drain_timeout_s: float = 30.0        # SIGTERM: how long in-flight requests may take to finish
    ping_interval_s: float = 10.0        # Anthropic streams: a `ping` event when nothing else was sent
    served_model_names: tuple[str, ...] = ()  # extra names the model answers to (besides kernel.model_name)
