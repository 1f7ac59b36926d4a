"""Plugin module of the built-in batched sampler (entry point `torch_sampler`)."""
from __future__ import annotations

from typing import Any

from modelcall.core import hookimpl


@hookimpl(trylast=True)
def provide_sampler(config: Any) -> Any:
    if not config.wants("sampler", "torch"):
        return None
    from modelcall.plugins.sampler.sampler import TorchSampler
    return TorchSampler()
