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
    """A GGUF file (or a directory holding one) described as a model directory (gguf_file.py), or a hub id
    (`--model org/name`) resolved to its local snapshot (downloaded unless HF_HUB_OFFLINE), GGUF snapshots too."""
    import os

    from modelcall.plugins.runner import gguf_file, hub
    model = getattr(config, "model", None)
    if not model:
        return None
    wanted = getattr(config, "gguf_file", None)
    path = os.path.expanduser(model)
    if os.path.isfile(path):
        if not gguf_file.is_gguf(path):
            return None
        return gguf_file.materialize(path, _kernel_types())
    if os.path.isdir(path):
        found = gguf_file.find_in_dir(path, wanted)
        return gguf_file.materialize(found, _kernel_types()) if found else None
    if not hub.is_hub_id(model):
        return None
    snapshot = hub.resolve(model, getattr(config, "revision", None), getattr(config, "download_dir", None), wanted)
    if os.path.isfile(os.path.join(snapshot, "config.json")) and not wanted:
        return snapshot
    found = gguf_file.find_in_dir(snapshot, wanted)
    if found is None:
        from modelcall.core import ModelNotFound
        raise ModelNotFound(f"{model} (snapshot {snapshot}) has neither config.json nor a GGUF file: name the "
                            "repository's GGUF file with --gguf-file NAME")
    return gguf_file.materialize(found, _kernel_types())


def _kernel_types() -> set[str]:
    from modelcall.plugins.runner import quant
    return {name for name, value in quant.GGML_TYPES.items() if quant.supported(value)}
