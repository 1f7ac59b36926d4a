"""What is installed: every plugin with its version and hooks, and which plugin provides each stage.

Without a running kernel nothing is loaded: asking the provider hooks would load the model. The
provider reported for a stage is then the first implementation in pluggy's call order (installed
plugins before `trylast` built-ins, blocked plugins left out), and `resolved_by` says so: that
plugin may still decline when asked (most check `config.wants(stage, name)`). With a running
kernel the answer is exact: the plugin whose hook returned the stage object.
"""
from __future__ import annotations

from importlib import metadata
from typing import Any

from modelcall.core import PluginHost

# stage name (as in KernelConfig) -> provider hook
STAGE_HOOKS: dict[str, str] = {
    "model_dir": "provide_model_dir",
    "tokenizer": "provide_tokenizer",
    "sampler": "provide_sampler",
    "runner": "provide_model_runner",
    "kv_cache": "provide_kv_cache",
    "scheduler": "provide_scheduler",
}
CALL_ORDER = "first in call order (not asked: asking would load the model)"
ANSWERED = "answered by the running kernel"


def _modelcall_version() -> str | None:
    try:
        return metadata.version("modelcall")
    except metadata.PackageNotFoundError:
        return None


def describe(host: PluginHost, config: Any = None) -> dict[str, Any]:
    """The listing as JSON-ready data: `{"modelcall": version, "plugins": [...], "stages": {...}}`."""
    stages: dict[str, dict[str, Any]] = {}
    for stage, hook in STAGE_HOOKS.items():
        candidates = [impl.plugin_name for impl in reversed(getattr(host.pm.hook, hook).get_hookimpls())]
        configured = getattr(config, "model" if stage == "model_dir" else stage, None)
        if stage in host.providers:
            provider, how = host.providers[stage], ANSWERED
        elif stage == "model_dir" and configured:
            provider, how = None, "config.model is set: no plugin is asked"
        else:
            provider, how = (candidates[0] if candidates else None), CALL_ORDER
        stages[stage] = {"provider": provider, "resolved_by": how, "configured": configured,
                         "candidates": candidates}
    version = _modelcall_version()
    plugins = []
    for row in host.describe():
        row = dict(row)
        if row["distribution"] is None and row["name"] in _builtin_entrypoint_names():
            row["distribution"], row["version"] = "modelcall", version
        row["provides"] = [s for s, v in stages.items() if v["provider"] == row["name"]]
        plugins.append(row)
    return {"modelcall": version, "plugins": plugins, "stages": stages}


def _builtin_entrypoint_names() -> set[str]:
    return {ep.name for ep in metadata.entry_points(group="modelcall")
            if getattr(getattr(ep, "dist", None), "name", None) == "modelcall"}


def render_text(listing: dict[str, Any]) -> str:
    """The listing as two aligned tables, for a terminal."""
    rows = [(p["name"], p["version"] or "-", p["distribution"] or "-", ", ".join(p["hooks"]) or "-")
            for p in listing["plugins"]]
    out = [f"modelcall {listing['modelcall'] or '?'}", "", *_table(("plugin", "version", "distribution", "hooks"), rows), ""]
    srows = []
    for stage, s in listing["stages"].items():
        others = [c for c in s["candidates"] if c != s["provider"]]
        note = s["resolved_by"] + (f"; then: {', '.join(others)}" if others else "")
        srows.append((stage, s["provider"] or "-", str(s["configured"]), note))
    out += _table(("stage", "provider", "configured", "how"), srows)
    return "\n".join(out) + "\n"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths[:-1]) + "  {}"
    return [fmt.format(*header).rstrip(), fmt.format(*("-" * w for w in widths)).rstrip(),
            *(fmt.format(*r).rstrip() for r in rows)]
