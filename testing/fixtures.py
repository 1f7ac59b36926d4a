"""pytest fixtures for modelcall plugin tests (loaded through the `pytest11` entry point).

* `make_kernel(plugins=[...], **config)`: an async context manager giving a started kernel on
  the tiny demo model with the built-in stages plus `plugins`.
* `events`: an `EventCollector` added to every kernel `make_kernel` builds in this test.
* `live_server(plugins=[...], **config)`: an async context manager giving a `LiveServer` (the
  kernel, its URL and an aiohttp client) serving the HTTP API on a free loopback port.

Async tests run on anyio's pytest plugin: mark them `@pytest.mark.anyio`.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from modelcall.testing.collector import EventCollector
from modelcall.testing.kernels import kernel_for_test
from modelcall.testing.server import server_for_test

# NOTE: plugin tests run on the random-weight demo model (fast, and its outputs are the references);
# a test that wants the trained demo model gives model=trained_model_dir().
os.environ.setdefault("MODELCALL_DEMO_MODEL", "random")


class _TestPlugins:
    """Plugins that fixtures register for the duration of one test (and unregister after)."""

    def __init__(self) -> None:
        self.plugins: list[Any] = []


@pytest.fixture
def modelcall_test_plugins() -> Iterator[_TestPlugins]:
    registry = _TestPlugins()
    yield registry
    registry.plugins.clear()


@pytest.fixture
def make_kernel(modelcall_test_plugins: _TestPlugins) -> Callable[..., AbstractAsyncContextManager]:
    """Factory: `async with make_kernel(plugins=[...], **config) as kernel:` (see kernel_for_test)."""

    def make(plugins: Any = (), **kwargs: Any) -> AbstractAsyncContextManager:
        return kernel_for_test([*modelcall_test_plugins.plugins, *plugins], **kwargs)

    return make


@pytest.fixture
def events(modelcall_test_plugins: _TestPlugins) -> Iterator[EventCollector]:
    """Every event of the kernels this test makes with `make_kernel`, in order."""
    collector = EventCollector()
    modelcall_test_plugins.plugins.append(collector)
    yield collector
    modelcall_test_plugins.plugins.remove(collector)


@pytest.fixture
def live_server(modelcall_test_plugins: _TestPlugins) -> Callable[..., AbstractAsyncContextManager]:
    """Factory: `async with live_server(plugins=[...], **config) as server:` then
    `await server.client.get("/v1/models")` (see server_for_test)."""

    def make(plugins: Any = (), **kwargs: Any) -> AbstractAsyncContextManager:
        return server_for_test([*modelcall_test_plugins.plugins, *plugins], **kwargs)

    return make
