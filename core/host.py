"""The plugin host: one pluggy manager per kernel, so kernels in one process never share plugins.

Plugins come from the `modelcall` entry-point group (the built-ins are entry points of this
distribution too, registered `trylast`), from module paths given on the command line
(`--plugin pkg.mod`), and from objects handed to `Kernel(plugins=[...])`; `-p no:NAME`
blocks one by name.
"""
from __future__ import annotations

import importlib
import inspect
import types
from collections.abc import Iterable
from importlib import metadata
from typing import Any

import pluggy

from modelcall.core import hookspecs
from modelcall.core.errors import ConfigError, PluginError

PluginLike = str | types.ModuleType | object


class PluginHost:
    """Discovers, registers and calls the plugins of one kernel."""

    def __init__(self, plugins: Iterable[PluginLike] = (), *, blocked: Iterable[str] = (),
                 load_entrypoints: bool = True) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.versions: dict[str, tuple[str, str]] = {}  # plugin name -> (distribution, version)
        self.providers: dict[str, str] = {}  # stage -> name of the plugin whose provider answered
        self.pm.add_hookspecs(hookspecs)
        for name in blocked:
            self.pm.set_blocked(name.removeprefix("no:"))
        if load_entrypoints:
            self._load_entrypoints()
        for plugin in plugins:
            self.add(plugin)
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as e:
            raise PluginError(self.pm.get_name(e.plugin) or "?", "check_pending", str(e)) from e

    def _load_entrypoints(self) -> None:
        for ep in metadata.entry_points(group=hookspecs.PROJECT):
            if self.pm.is_blocked(ep.name) or self.pm.get_plugin(ep.name) is not None:
                continue
            try:
                plugin = ep.load()
            except Exception as e:
                raise PluginError(ep.name, "import", e) from e
            self._register(plugin, ep.name)
            dist = getattr(ep, "dist", None)
            self.versions[ep.name] = (dist.name, dist.version) if dist else ("?", "?")

    def add(self, plugin: PluginLike, name: str | None = None) -> str | None:
        """Register a plugin object, module, or importable module path; returns its name
        (None when blocked)."""
        if isinstance(plugin, str):
            name = name or plugin
            if self.pm.is_blocked(name):
                return None
            try:
                plugin = importlib.import_module(plugin)
            except Exception as e:
                raise PluginError(name, "import", e) from e
        name = name or getattr(plugin, "modelcall_plugin_name", None) or getattr(plugin, "__name__", None) \
            or f"{type(plugin).__name__}-{id(plugin):x}"
        if self.pm.is_blocked(name):
            return None
        return self._register(plugin, name)

    def _register(self, plugin: object, name: str) -> str:
        try:
            self.pm.register(plugin, name=name)
        except ValueError as e:  # already registered under this name
            raise PluginError(name, "register", e) from e
        except pluggy.PluginValidationError as e:
            raise PluginError(name, "register", str(e)) from e
        return name

    # ---- calling ----------------------------------------------------------------------------

    def provide(self, hook: str, stage: str, **kwargs: Any) -> Any:
        """Call a firstresult provider hook; raise a clear error when nobody provides.

        Records which plugin provided the stage in `self.providers[stage]`.
        """
        caller = getattr(self.pm.hook, hook)
        impls = caller.get_hookimpls()
        provider: str | None = None
        try:
            if any(i.hookwrapper or i.wrapper for i in impls):
                result = caller(**kwargs)
            else:  # pluggy's own firstresult loop, so we know whose answer won
                result = None
                for impl in reversed(impls):
                    provider = impl.plugin_name
                    result = impl.function(*[kwargs[a] for a in impl.argnames])
                    if result is not None:
                        break
        except PluginError:
            raise
        except Exception as e:
            raise PluginError(provider or self._culprit(e, hook), hook, e) from e
        if result is None:
            wanted = getattr(kwargs.get("config"), stage, "auto") if stage else "auto"
            raise ConfigError(f"no plugin provides the {stage} stage (configured: {wanted!r}); "
                              f"installed plugins: {', '.join(self.names()) or 'none'}")
        if inspect.isawaitable(result):
            raise PluginError(provider or self._provider_of(hook), hook, "provider hooks must be synchronous")
        self.providers[stage] = provider or self._provider_of(hook)  # with wrappers: first in call order
        return result

    def collect(self, hook: str, **kwargs: Any) -> list[tuple[str, tuple, dict]]:
        """Call a register_* hook on each plugin; returns (plugin name, args, kwargs) per register() call."""
        items: list[tuple[str, tuple, dict]] = []
        for impl in reversed(getattr(self.pm.hook, hook).get_hookimpls()):
            def register(*args: Any, _plugin: str = impl.plugin_name, **kw: Any) -> None:
                items.append((_plugin, args, kw))
            call_kwargs = dict(kwargs, register=register)
            try:
                impl.function(*[call_kwargs[a] for a in impl.argnames])
            except Exception as e:
                raise PluginError(impl.plugin_name, hook, e) from e
        return items

    async def lifecycle(self, hook: str, *, only: Iterable[str] | None = None, done: list[str] | None = None,
                        **kwargs: Any) -> None:
        """Call a lifecycle hook on each plugin in turn, awaiting async implementations.

        `only` limits the call to the named plugins; each plugin whose implementation returned is
        appended to `done` (so a failed start-up can shut down exactly what did start).
        """
        wanted = None if only is None else set(only)
        for impl in reversed(getattr(self.pm.hook, hook).get_hookimpls()):
            if wanted is not None and impl.plugin_name not in wanted:
                continue
            try:
                result = impl.function(*[kwargs[a] for a in impl.argnames])
                if inspect.isawaitable(result):
                    await result
            except Exception as e:
                raise PluginError(impl.plugin_name, hook, e) from e
            if done is not None:
                done.append(impl.plugin_name)

    def _culprit(self, exc: BaseException, hook: str) -> str:
        codes = {impl.function.__code__: impl.plugin_name
                 for impl in getattr(self.pm.hook, hook).get_hookimpls() if hasattr(impl.function, "__code__")}
        tb = exc.__traceback__
        culprit = "?"
        while tb is not None:  # the innermost hook implementation on the stack is to blame
            culprit = codes.get(tb.tb_frame.f_code, culprit)
            tb = tb.tb_next
        return culprit

    def _provider_of(self, hook: str) -> str:
        impls = getattr(self.pm.hook, hook).get_hookimpls()
        return impls[-1].plugin_name if impls else "?"

    # ---- introspection ----------------------------------------------------------------------

    def names(self) -> list[str]:
        return [name for name, plugin in self.pm.list_name_plugin() if plugin is not None]

    def describe(self) -> list[dict[str, Any]]:
        """Every registered plugin with its distribution, version and implemented hooks."""
        rows = []
        for name, plugin in self.pm.list_name_plugin():
            if plugin is None:  # blocked
                continue
            hooks = sorted(h.name for h in self.pm.get_hookcallers(plugin) or ())
            dist, version = self.versions.get(name, (None, None))
            rows.append({"name": name, "distribution": dist, "version": version, "hooks": hooks})
        return rows
