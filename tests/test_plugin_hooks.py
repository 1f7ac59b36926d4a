"""Hook evolution: implementations that take a subset of a hook's arguments keep working when a spec grows."""
import inspect
import types

import pluggy

from modelcall.core import KernelConfig, PluginHost, hookimpl, hookspecs
from modelcall.core.hookspecs import PROJECT


def grown_specs(extra: str = "added_in_a_later_release") -> types.ModuleType:
    """Today's hook specs, each with one more argument, as a future modelcall would ship them."""
    module = types.ModuleType("future_hookspecs")
    for _name, fn in inspect.getmembers(hookspecs, lambda f: hasattr(f, f"{PROJECT}_spec")):
        opts = getattr(fn, f"{PROJECT}_spec")
        params = [*inspect.signature(fn).parameters, extra]
        ns: dict = {}
        exec(f"def {fn.__name__}({', '.join(params)}): pass", ns)  # noqa: S102 - a test builds a spec
        setattr(module, fn.__name__, hookspecs.hookspec(**opts)(ns[fn.__name__]))
    return module


class WrittenAgainstToday:
    """One implementation of every hook, each taking fewer arguments than even today's spec."""

    modelcall_plugin_name = "old-plugin"

    def __init__(self):
        self.seen = []

    @hookimpl
    def provide_scheduler(self, kv_cache):
        self.seen.append(("provide_scheduler", kv_cache))
        return "sched"

    @hookimpl
    def provide_tokenizer(self, model_dir):
        return f"tok:{model_dir}"

    @hookimpl
    def register_observers(self, register):
        register(object, print)

    @hookimpl
    def register_tools(self, register):
        register(len)

    @hookimpl
    def startup(self):
        self.seen.append("startup")


def test_a_subset_implementation_works_against_a_grown_spec():
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(grown_specs())
    plugin = WrittenAgainstToday()
    pm.register(plugin)
    pm.check_pending()
    extra = {"added_in_a_later_release": "new"}
    assert pm.hook.provide_scheduler(config=KernelConfig(), kv_cache="kv", waiting_queue=None, **extra) == "sched"
    assert pm.hook.provide_tokenizer(config=KernelConfig(), model_dir="/m", **extra) == "tok:/m"
    got = []
    pm.hook.register_tools(register=got.append, **extra)
    assert got == [len]
    pm.hook.startup(kernel=None, **extra)
    assert plugin.seen == [("provide_scheduler", "kv"), "startup"]


def test_the_plugin_host_passes_each_implementation_only_the_arguments_it_names():
    host = PluginHost([WrittenAgainstToday()], load_entrypoints=False)
    assert host.provide("provide_scheduler", "scheduler", config=KernelConfig(), kv_cache="kv") == "sched"
    # register_* hooks are called one implementation at a time with the arguments it asked for
    assert host.collect("register_observers", config=KernelConfig()) == [("old-plugin", (object, print), {})]

