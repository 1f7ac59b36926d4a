"""Kernels for tests: the tiny demo model, fp32, one thread, with exactly the plugins a test names."""
from __future__ import annotations

import functools
import os
import sys
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from importlib import metadata
from typing import Any

from modelcall.core import Kernel
from modelcall.core.hookspecs import PROJECT

# NOTE: fp32 and one thread make outputs exact and repeatable (bf16 batched greedy output differs
# from single-request output on random weights); a small KV pool keeps start-up fast.
TEST_CONFIG: dict[str, Any] = {"dtype": "float32", "threads": 1, "num_kv_blocks": 256}


def installed_plugin_names(*, exclude_distributions: Iterable[str] = ("modelcall",)) -> list[str]:
    """Entry-point names of the installed `modelcall` plugins that do not come with modelcall."""
    return list(_plugin_names(_path_state(), frozenset(exclude_distributions)))


def _path_state() -> tuple[tuple[str, int | None], ...]:
    # NOTE: the scan reads every installed distribution's metadata (~30 ms, ~55 ms under coverage) and
    # kernel_for_test asks once per kernel. Keyed by sys.path and its folders' mtimes, as importlib.metadata's
    # own path cache is: a folder prepended or a distribution installed since is seen.
    state = []
    for entry in sys.path:
        try:
            state.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            state.append((entry, None))
    return tuple(state)


@functools.lru_cache(maxsize=16)
def _plugin_names(path_state: tuple, skip: frozenset[str]) -> tuple[str, ...]:
    names = []
    for ep in metadata.entry_points(group=PROJECT):
        dist = getattr(ep, "dist", None)
        if dist is None or dist.name not in skip:
            names.append(ep.name)
    return tuple(names)


def _plugin_name(plugin: Any) -> str | None:
    if isinstance(plugin, str):
        return plugin
    return getattr(plugin, "modelcall_plugin_name", None) or getattr(plugin, "__name__", None)


@asynccontextmanager
async def kernel_for_test(plugins: Iterable[Any] = (), *, installed: bool = False, blocked: Iterable[str] = (),
                          **config: Any) -> AsyncIterator[Kernel]:
    """A started kernel on the built-in demo model with the built-in stages plus `plugins`.

    Other installed plugins (third-party entry points) are blocked unless `installed=True`, so
    a test sees the same kernel whatever else is installed next to it. `config` overrides
    `TEST_CONFIG` and any other `KernelConfig` field.
    """
    plugins = list(plugins)
    installed_names = set(installed_plugin_names())
    wanted = {_plugin_name(p) for p in plugins}
    # NOTE: a plugin given here that is also installed is loaded through its entry point (with
    # its version); registering the same module twice would be an error.
    plugins = [p for p in plugins if _plugin_name(p) not in installed_names]
    block = set(blocked)
    if not installed:
        block |= installed_names - wanted
    kernel = Kernel(plugins=plugins, blocked=sorted(block), **{**TEST_CONFIG, **config})
    await kernel.start()
    try:
        yield kernel
    finally:
        await kernel.stop()
