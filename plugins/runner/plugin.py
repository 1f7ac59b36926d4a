"""Plugin module of the built-in torch model runner (entry point `torch_runner`)."""
from __future__ import annotations

from typing import Any

from modelcall.core import hookimpl


@hookimpl(trylast=True)
def provide_model_runner(config: Any, model_dir: str, sampler: Any) -> Any:
    if not config.wants("runner", "torch"):
        return None
    from modelcall.plugins.runner.runner import TorchModelRunner
    return TorchModelRunner(config, model_dir, sampler)
