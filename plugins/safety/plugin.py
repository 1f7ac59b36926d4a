"""Registers the built-in safety filters that the deployment configured.

    plugin_config = {"safety": {"blocklist": ["forbidden phrase"], "blocklist_regex": [],
                                "redact_pii": true, "block_pii_input": false}}
"""
from __future__ import annotations

from typing import Any

from modelcall.core import hookimpl
from modelcall.plugins.safety.blocklist import Blocklist
from modelcall.plugins.safety.pii import PiiRedactor


def settings(config: Any) -> dict[str, Any]:
    return dict((getattr(config, "plugin_config", None) or {}).get("safety") or {})


@hookimpl(trylast=True)
def register_safety_filters(register: Any, config: Any) -> None:
    cfg = settings(config)
    literals, regexes = cfg.get("blocklist") or [], cfg.get("blocklist_regex") or []
    if literals or regexes:
        register(Blocklist(literals, regexes, max_match=int(cfg.get("blocklist_max_match", 64))))
    if cfg.get("redact_pii") or cfg.get("block_pii_input"):
        register(PiiRedactor(block_input=bool(cfg.get("block_pii_input"))))
