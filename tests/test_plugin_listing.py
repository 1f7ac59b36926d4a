"""`modelcall plugins [--json]`: installed plugins, versions, hooks, and which plugin provides each stage."""
import argparse
import json

import pytest

from modelcall.core import KernelConfig, PluginHost, hookimpl
from modelcall.plugins import devtools
from modelcall.plugins.devtools.listing import ANSWERED, CALL_ORDER, describe


class BuiltinScheduler:
    modelcall_plugin_name = "builtin-sched"

    @hookimpl(trylast=True)
    def provide_scheduler(self, config, kv_cache):
        return "builtin"


class NamedScheduler:
    """Serves only when configuration leaves the stage open or names it."""

    modelcall_plugin_name = "spf"

    @hookimpl
    def provide_scheduler(self, config):
        return "spf" if config.wants("scheduler", "spf") else None


def test_without_a_kernel_the_provider_is_the_first_in_call_order_and_says_so():
    host = PluginHost([BuiltinScheduler(), NamedScheduler()], load_entrypoints=False)
    stages = describe(host, KernelConfig())["stages"]
    assert stages["scheduler"] == {"provider": "spf", "resolved_by": CALL_ORDER, "configured": "auto",
                                   "candidates": ["spf", "builtin-sched"]}
    assert stages["tokenizer"]["provider"] is None and stages["tokenizer"]["candidates"] == []


def test_once_a_stage_was_provided_the_listing_names_the_plugin_that_answered():
    host = PluginHost([BuiltinScheduler(), NamedScheduler()], load_entrypoints=False)
    cfg = KernelConfig(scheduler="default")  # spf declines
    assert host.provide("provide_scheduler", "scheduler", config=cfg, kv_cache=None) == "builtin"
    listing = describe(host, cfg)
    assert listing["stages"]["scheduler"]["provider"] == "builtin-sched"
    assert listing["stages"]["scheduler"]["resolved_by"] == ANSWERED
    row = next(p for p in listing["plugins"] if p["name"] == "builtin-sched")
    assert row["provides"] == ["scheduler"] and row["hooks"] == ["provide_scheduler"]


def test_the_command_lists_the_installed_builtins_with_versions_as_json(capsys):
    parser = argparse.ArgumentParser()
    devtools.configure(parser)
    assert devtools.run(parser.parse_args(["--json"])) == 0
    listing = json.loads(capsys.readouterr().out)
    rows = {p["name"]: p for p in listing["plugins"]}
    assert rows["devtools"]["distribution"] == "modelcall" and rows["devtools"]["version"] == listing["modelcall"]
    assert "register_commands" in rows["devtools"]["hooks"]
    assert set(listing["stages"]) >= {"model_dir", "tokenizer", "sampler", "runner", "kv_cache", "scheduler"}
    for stage in listing["stages"].values():
        assert stage["provider"] is None or stage["provider"] in rows


def test_the_command_honours_the_global_plugin_options(capsys):
    from modelcall.plugins.cli.main import main

    assert main(["--plugin", "modelcall.plugins.devtools.hookdocs", "-p", "no:http", "plugins", "--json"]) == 0
    names = {p["name"] for p in json.loads(capsys.readouterr().out)["plugins"]}
    assert "http" not in names and "modelcall.plugins.devtools.hookdocs" in names and "devtools" in names


def test_the_text_listing_is_a_table_of_plugins_and_stages(capsys):
    parser = argparse.ArgumentParser()
    devtools.configure(parser)
    devtools.run(parser.parse_args([]))
    out = capsys.readouterr().out
    assert "plugin" in out and "hooks" in out and "register_commands" in out
    assert "scheduler" in out and "first in call order" in out


@pytest.mark.anyio
async def test_get_plugins_serves_the_same_listing_with_the_providers_that_answered(live_server, capsys):
    from modelcall.testing import ScriptedSampler

    async with live_server(plugins=[ScriptedSampler()]) as server:
        resp = await server.client.get("/-/plugins")
        assert resp.status == 200
        listing = await resp.json()
        # every registered plugin, with the hooks pluggy says it implements
        pm = server.kernel.host.pm
        assert {p["name"]: p["hooks"] for p in listing["plugins"]} == \
            {name: sorted(h.name for h in pm.get_hookcallers(plugin) or ()) for name, plugin in pm.list_name_plugin()
             if plugin is not None}
        # the same rows as `modelcall plugins --json` for what both load (the command has no test plugin)
        parser = argparse.ArgumentParser()
        devtools.configure(parser)
        assert devtools.run(parser.parse_args(["--json"])) == 0
        command = {p["name"]: p for p in json.loads(capsys.readouterr().out)["plugins"]}
        served = {p["name"]: p for p in listing["plugins"]}
        assert {"devtools", "paged_kv", "scheduler", "torch_sampler"} <= set(command) & set(served)
        assert all({k: served[n][k] for k in ("distribution", "version", "hooks")} ==
                   {k: command[n][k] for k in ("distribution", "version", "hooks")} for n in set(command) & set(served))
        stages = listing["stages"]
        assert stages["sampler"]["provider"] == "modelcall.testing.scripted_sampler"
        assert stages["sampler"]["candidates"][-1] == "torch_sampler"  # the built-in, trylast
        six = ("model_dir", "tokenizer", "sampler", "runner", "kv_cache", "scheduler")
        assert all(stages[name]["resolved_by"] == ANSWERED for name in six)
        assert stages["model_dir"]["provider"] == "demo_model"
        assert stages["scheduler"]["provider"] == "scheduler" and stages["kv_cache"]["provider"] == "paged_kv"
        openapi = await (await server.client.get("/openapi.json")).json()
        assert "/-/plugins" in openapi["paths"]
