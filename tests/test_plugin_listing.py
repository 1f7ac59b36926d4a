"""`modelcall plugins [--json]`: installed plugins, versions, hooks, and which plugin provides each stage."""
import argparse
import json

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
    assert set(listing["stages"]) == {"model_dir", "tokenizer", "sampler", "runner", "kv_cache", "scheduler"}
    for stage in listing["stages"].values():
        assert stage["provider"] is None or stage["provider"] in rows


def test_the_command_honours_extra_and_blocked_plugins(capsys):
    parser = argparse.ArgumentParser()
    devtools.configure(parser)
    args = parser.parse_args(["--json", "--plugin", "modelcall.plugins.devtools.hookdocs", "-p", "no:devtools"])
    devtools.run(args)
    names = {p["name"] for p in json.loads(capsys.readouterr().out)["plugins"]}
    assert "devtools" not in names and "modelcall.plugins.devtools.hookdocs" in names


def test_the_text_listing_is_a_table_of_plugins_and_stages(capsys):
    parser = argparse.ArgumentParser()
    devtools.configure(parser)
    devtools.run(parser.parse_args([]))
    out = capsys.readouterr().out
    assert "plugin" in out and "hooks" in out and "register_commands" in out
    assert "scheduler" in out and "first in call order" in out
