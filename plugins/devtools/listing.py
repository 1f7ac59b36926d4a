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

from modelcall.core import PluginHost, hookspecs



def stage_hooks() -> dict[str, str]:
    """Stage name (as `KernelConfig` and `PluginHost.provide` spell it) -> provider hook, for every
    `firstresult` hook in the specs, so a provider hook added later is listed too."""
    names = {"provide_model_runner": "runner"}
    marker = f"{hookspecs.PROJECT}_spec"
    return {names.get(name, name.removeprefix("provide_")): name for name, fn in vars(hookspecs).items()
            if (getattr(fn, marker, None) or {}).get("firstresult")}


STAGE_HOOKS = stage_hooks()
CALL_ORDER = "first in call order (not asked: asking would load the model)"
NOT_RECORDED = "first in call order (the kernel did not record who answered)"
ANSWERED = "answered by the running kernel"
_RECORDED_AS = {"model_dir": "model"}  # the stage name the kernel passes to PluginHost.provide


def _modelcall_version() -> str | None:
    try:
        return metadata.version("modelcall")
    except metadata.PackageNotFoundError:
        return None


def describe(host: PluginHost, config: Any = None, *, running: bool = False) -> dict[str, Any]:
    """The listing as JSON-ready data: `{"modelcall": version, "plugins": [...], "stages": {...}}`.

    `running`: `host` belongs to a started kernel, so the stages it provided are known exactly.
    """
    stages: dict[str, dict[str, Any]] = {}
    for stage, hook in STAGE_HOOKS.items():
        candidates = [impl.plugin_name for impl in reversed(getattr(host.pm.hook, hook).get_hookimpls())]
        configured = getattr(config, "model" if stage == "model_dir" else stage, None)
        answered = host.providers.get(_RECORDED_AS.get(stage, stage))
        if answered is not None:
            provider, how = answered, ANSWERED
        elif stage == "model_dir" and configured:
            provider, how = None, "config.model is set: no plugin is asked"
        else:
            provider, how = (candidates[0] if candidates else None), NOT_RECORDED if running else CALL_ORDER
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
