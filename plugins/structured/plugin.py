"""Provides the llguidance constraint backend (response_format json_object/json_schema, forced tool_choice)."""
from __future__ import annotations

import logging
from typing import Any

from modelcall.core.hookspecs import hookimpl

log = logging.getLogger("modelcall.structured")


@hookimpl(trylast=True)
def provide_constraint_backend(config: Any, tokenizer: Any, model_dir: str) -> Any:
    opts = config.plugin_config.get("structured") or {}
    if opts.get("enabled", True) is False:
        return None
    try:
        from modelcall.plugins.structured.backend import LLGuidanceBackend

        return LLGuidanceBackend(tokenizer, model_dir, threads=int(opts.get("threads", 2)))
    except Exception as e:  # noqa: BLE001 - serve without constraints rather than not at all
        log.warning("constrained decoding is unavailable for this model (%s: %s); requests that need it are "
                    "refused", type(e).__name__, e)
        return None


@hookimpl
def shutdown(kernel: Any) -> None:
    backend = getattr(getattr(kernel, "tools", None), "backend", None)
    if backend is not None and hasattr(backend, "prefetch"):
        backend.prefetch.close()
