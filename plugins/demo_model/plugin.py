"""Provides the demo model's directory when no model is configured, and hosts its two tools.

Which demo model: the model trained here (committed in the package, `trained/`; it answers
arithmetic through the calculator and the weather through get_weather, issue 19), unless the
environment says `MODELCALL_DEMO_MODEL=random`: the seeded random-weight model built into the user
cache, which the test suite and the throughput benchmarks use (tests/conftest.py sets it).
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
    if getattr(config, "model", None):
        return None
    from modelcall.plugins.demo_model import demo_model_dir, trained_model_dir
    return trained_model_dir() if wanted_kind() == "trained" else demo_model_dir()


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
