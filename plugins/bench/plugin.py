"""Plugin module registering `modelcall bench` (entry point `bench`)."""
from __future__ import annotations

from typing import Any

from modelcall.core import hookimpl


@hookimpl
def register_commands(register: Any) -> None:
    from modelcall.plugins.bench import throughput
    register("bench", "measure throughput through a Kernel (bench throughput --model DIR --dataset FILE.jsonl)",
             throughput.configure, throughput.run)
