"""Provides the demo model's directory when no model is configured."""
from __future__ import annotations

from typing import Any

from modelcall.core import hookimpl


@hookimpl(trylast=True)
def provide_model_dir(config: Any) -> str | None:
    if getattr(config, "model", None):
        return None
    from modelcall.plugins.demo_model import demo_model_dir
    return demo_model_dir()
