"""The plugin host: one pluggy manager per kernel, providers that decline, blocking, clear errors."""
import types

import pytest

from modelcall.core import KernelConfig, PluginHost, hookimpl
from modelcall.core.errors import ConfigError, PluginError


class UpperTokenizerPlugin:
    modelcall_plugin_name = "upper"

    @hookimpl
    def provide_tokenizer(self, config):  # a subset of the spec's arguments is enough
        return "upper-tokenizer" if config.wants("tokenizer", "upper") else None


class BuiltinLike:
    modelcall_plugin_name = "builtin-like"

    @hookimpl(trylast=True)
    def provide_tokenizer(self, config, model_dir):
        return f"builtin:{model_dir}"


def test_an_installed_plugin_wins_over_a_trylast_builtin_and_declines_when_not_named():
    host = PluginHost([BuiltinLike(), UpperTokenizerPlugin()], load_entrypoints=False)
    cfg = KernelConfig()
    assert host.provide("provide_tokenizer", "tokenizer", config=cfg, model_dir="d") == "upper-tokenizer"
    named = KernelConfig(tokenizer="something-else")
    assert host.provide("provide_tokenizer", "tokenizer", config=named, model_dir="d") == "builtin:d"


def test_blocking_a_plugin_by_name_removes_it():
    host = PluginHost([BuiltinLike(), UpperTokenizerPlugin()], blocked=["no:upper"], load_entrypoints=False)
    assert "upper" not in host.names()
    assert host.provide("provide_tokenizer", "tokenizer", config=KernelConfig(), model_dir="d") == "builtin:d"


def test_nobody_providing_a_stage_is_a_clear_error():
    host = PluginHost([UpperTokenizerPlugin()], load_entrypoints=False)
    with pytest.raises(ConfigError, match=r"no plugin provides the tokenizer stage \(configured: 'hf'\)"):
        host.provide("provide_tokenizer", "tokenizer", config=KernelConfig(tokenizer="hf"), model_dir="d")


def test_a_raising_provider_is_named_in_the_error():
    class Broken:
        modelcall_plugin_name = "broken-runner"

        @hookimpl
        def provide_sampler(self, config):
            raise RuntimeError("cannot find libfoo.so")

    host = PluginHost([Broken()], load_entrypoints=False)
    with pytest.raises(PluginError) as e:
        host.provide("provide_sampler", "sampler", config=KernelConfig())
    assert e.value.plugin == "broken-runner" and "libfoo.so" in str(e.value)


def test_a_misspelled_hook_fails_at_start_up_naming_the_plugin():
    class Typo:
        modelcall_plugin_name = "typo"

        @hookimpl
        def provide_tokeniser(self, config):
            return None

    with pytest.raises(PluginError, match="typo"):
        PluginHost([Typo()], load_entrypoints=False)


def test_registration_hooks_record_which_plugin_registered_what():
    mod = types.ModuleType("obsplugin")

    @hookimpl
    def register_observers(register):
        register(object, print, name="printer")

    mod.register_observers = register_observers
    host = PluginHost([mod], load_entrypoints=False)
    (plugin, args, kw), = host.collect("register_observers", config=KernelConfig())
    assert plugin == "obsplugin" and args == (object, print) and kw == {"name": "printer"}


def test_two_hosts_share_no_plugins():
    a = PluginHost([UpperTokenizerPlugin()], load_entrypoints=False)
    b = PluginHost([], load_entrypoints=False)
    assert "upper" in a.names() and "upper" not in b.names()


def test_a_module_path_plugin_that_fails_to_import_is_named():
    with pytest.raises(PluginError, match="no_such_module_xyz"):
        PluginHost(["no_such_module_xyz"], load_entrypoints=False)
