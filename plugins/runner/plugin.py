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


@hookimpl(trylast=True)
def provide_model_dir(config: Any) -> str | None:
    """A hub id (`--model org/name`) resolved to its local snapshot (downloaded unless HF_HUB_OFFLINE)."""
    from modelcall.plugins.runner import hub
    model = getattr(config, "model", None)
    if not model or not hub.is_hub_id(model):
        return None
    return hub.resolve(model, getattr(config, "revision", None), getattr(config, "download_dir", None))
