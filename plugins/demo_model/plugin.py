"""Provides the demo models' directories by name (`--model trained`, `--model random`), and hosts the trained
one's two tools.

The trained model (committed in the package, `trained/`) answers arithmetic through the calculator and the
weather through get_weather (issue 19); the random one is the seeded random-weight model built into the user cache
that the test suite and the throughput benchmarks use. With no model configured the default model is SmolLM2
(plugins/registry_models), unless `MODELCALL_DEMO_MODEL=trained|random` makes a demo model the default
(tests/conftest.py sets random).
"""
from __future__ import annotations

import os
from typing import Any

from modelcall.core import hookimpl

DEMO_MODEL_ENV = "MODELCALL_DEMO_MODEL"
KINDS = ("trained", "random")


def wanted_kind() -> str:
    kind = os.environ.get(DEMO_MODEL_ENV, "").strip().lower() or "trained"
    if kind not in KINDS:
        from modelcall.core.errors import ConfigError
        raise ConfigError(f"{DEMO_MODEL_ENV}={kind!r}: give one of {', '.join(KINDS)}")
    return kind


@hookimpl(trylast=True)
def provide_model_dir(config: Any) -> str | None:
    """A demo model by name (`--model trained`, `--model random`), or with no model when MODELCALL_DEMO_MODEL
    names one (the test suite sets random); otherwise the default model is the registry models plugin's."""
    from modelcall.plugins.demo_model import demo_model_dir, trained_model_dir
    model = getattr(config, "model", None)
    if model is None:
        if not os.environ.get(DEMO_MODEL_ENV, "").strip():
            return None
        kind = wanted_kind()
    elif model in KINDS and not os.path.exists(model):
        kind = model
    else:
        return None
    return trained_model_dir() if kind == "trained" else demo_model_dir()


@hookimpl
def register_commands(register: Any) -> None:
    from modelcall.plugins.demo_model import command
    register("demo-model", "write a built-in demo model (the default one; --trained or --random to choose)",
             command.configure, command.run)


@hookimpl
def register_server_tools(register: Any, config: Any, kernel: Any) -> None:
    """`calculator` and `get_weather` as server-hosted tools (`demo__calculator`, `demo__get_weather`),
    only while the trained demo model is served: it is the model that knows them."""
    from modelcall.plugins.demo_model import trained_model_dir
    served = getattr(kernel, "model_dir", None)
    if not served or os.path.realpath(served) != os.path.realpath(trained_model_dir()):
        return
    from modelcall.plugins.demo_model.tools import TOOLS
    for t in TOOLS:
        register(t, server_label="demo")
