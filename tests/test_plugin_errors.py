"""Plugins that fail: a clear error naming the plugin and the hook, no half-started kernel or server;
an observer that raises is logged and counted while the engine keeps serving."""
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from modelcall.core import PluginError, PluginHost, Unavailable, hookimpl
from modelcall.events import Finished, TokensEmitted

pytestmark = pytest.mark.anyio


class Lifecycle:
    """Records its own startup and shutdown."""

    modelcall_plugin_name = "well-behaved"

    def __init__(self):
        self.calls = []

    @hookimpl
    def startup(self):
        self.calls.append("startup")

    @hookimpl
    def shutdown(self):
        self.calls.append("shutdown")


class RunnerCloseSpy:
    """Wraps whichever runner is provided, to see whether it gets closed (new-style wrapper)."""

    modelcall_plugin_name = "runner-spy"

    def __init__(self):
        self.closed = 0

    @hookimpl(wrapper=True)
    def provide_model_runner(self):
        runner = yield
        close = runner.close

        def counted_close():
            self.closed += 1
            close()
        runner.close = counted_close
        return runner


class StartupFails:
    modelcall_plugin_name = "needs-license"

    @hookimpl
    def startup(self):
        raise RuntimeError("no license key in $LICENSE_KEY")


class SchedulerFails:
    modelcall_plugin_name = "broken-scheduler"

    @hookimpl
    def provide_scheduler(self, config):
        raise ValueError(f"max_num_seqs {config.max_num_seqs} is not a prime")


class ObserverRegistrationFails:
    modelcall_plugin_name = "broken-observers"

    @hookimpl
    def register_observers(self, register):
        raise KeyError("dashboard_url")


async def test_a_plugin_raising_at_startup_stops_start_up_with_an_error_naming_it(make_kernel):
    ok, spy = Lifecycle(), RunnerCloseSpy()
    kernel_cm = make_kernel(plugins=[StartupFails(), ok, spy])  # `ok` starts first (registered later)
    with pytest.raises(PluginError) as e:
        async with kernel_cm:
            pytest.fail("the kernel must not start")
    assert e.value.plugin == "needs-license" and e.value.hook == "startup"
    assert str(e.value) == ("plugin 'needs-license' failed in hook startup: "
                            "RuntimeError: no license key in $LICENSE_KEY")
    assert ok.calls == ["startup", "shutdown"]  # what did start is shut down again
    assert spy.closed == 1                      # the model is released


@pytest.mark.parametrize("plugin, hook", [(SchedulerFails(), "provide_scheduler"),
                                          (ObserverRegistrationFails(), "register_observers")])
async def test_a_plugin_raising_in_a_hook_is_named_and_the_kernel_is_not_left_half_started(plugin, hook):
    from modelcall.core import Kernel
    from modelcall.testing import TEST_CONFIG

    spy = RunnerCloseSpy()
    kernel = Kernel(plugins=[plugin, spy], **TEST_CONFIG)
    with pytest.raises(PluginError) as e:
        await kernel.start()
    assert (e.value.plugin, e.value.hook) == (plugin.modelcall_plugin_name, hook)
    assert not kernel.ready and spy.closed == 1
    with pytest.raises(Unavailable):
        await kernel.submit("hello", max_tokens=2)
    await kernel.stop()  # harmless after a failed start
    assert spy.closed == 1


def test_an_installed_plugin_that_fails_to_import_is_named_and_can_be_blocked(tmp_path, monkeypatch, capsys):
    dist = tmp_path / "broken_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[modelcall]\nbroken = broken_plugin_mod\n")
    (tmp_path / "broken_plugin_mod.py").write_text("raise ImportError('libfoo.so.3: cannot open shared object')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match=r"plugin 'broken' failed in hook import: ImportError: libfoo.so.3"):
        PluginHost()
    assert "broken" not in PluginHost(blocked=["no:broken"]).names()

    from modelcall.plugins.cli.main import main
    assert main(["plugins"]) == 1
    err = capsys.readouterr().err
    assert "plugin 'broken' failed in hook import" in err and "-p no:NAME" in err
    assert main(["-p", "no:broken", "plugins"]) == 0


def test_modelcall_serve_with_a_plugin_failing_at_startup_exits_naming_it_without_listening(tmp_path):
    (tmp_path / "failing_plugin.py").write_text(textwrap.dedent("""
        from modelcall.core import hookimpl

        @hookimpl
        def startup():
            raise RuntimeError("the GPU quota is exhausted")
    """))
    env = dict(os.environ, PYTHONPATH=str(tmp_path), OMP_NUM_THREADS="1")
    cli = os.path.join(os.path.dirname(sys.executable), "modelcall")
    out = subprocess.run([cli, "--plugin", "failing_plugin", "serve", "--port", "0", "--dtype", "float32",
                          "--num-kv-blocks", "64"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 1
    assert ("modelcall: error: plugin 'failing_plugin' failed in hook startup: "
            "RuntimeError: the GPU quota is exhausted") in out.stderr, out.stderr[-2000:]
    assert "serving" not in out.stdout


class RoutesFail:
    modelcall_plugin_name = "broken-routes"

    @hookimpl
    def register_routes(self, register):
        raise RuntimeError("route table corrupt")


async def test_a_plugin_failing_to_register_routes_stops_serve_before_it_listens():
    import socket

    from modelcall.core import Kernel
    from modelcall.plugins.http.serve import serve
    from modelcall.plugins.http.settings import ServerSettings
    from modelcall.testing import TEST_CONFIG

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    lifecycle = Lifecycle()
    kernel = Kernel(plugins=[RoutesFail(), lifecycle], **TEST_CONFIG)
    with pytest.raises(PluginError, match="plugin 'broken-routes' failed in hook register_routes"):
        await serve(kernel, ServerSettings(port=port))
    assert lifecycle.calls == ["startup", "shutdown"] and not kernel.ready
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


class RaisesOnTokens:
    modelcall_plugin_name = "flaky-dashboard"

    @hookimpl
    def register_observers(self, register):
        def observe(event):
            raise ConnectionError("dashboard is down")
        register(TokensEmitted, observe, name="flaky-dashboard")


async def test_an_observer_that_raises_is_logged_and_counted_and_the_engine_keeps_serving(make_kernel, events, caplog):
    caplog.set_level(logging.ERROR, logger="modelcall.events")
    async with make_kernel(plugins=[RaisesOnTokens()]) as kernel:
        first = await kernel.complete("one", max_tokens=4, ignore_eos=True)
        second = await kernel.complete("two", max_tokens=3, ignore_eos=True)
        errors = kernel.stats()["observer_errors"]
    assert (first.finish_reason, second.finish_reason) == ("length", "length")
    assert first.usage.completion_tokens == 4 and second.usage.completion_tokens == 3
    num_deltas = len(events.of(TokensEmitted))  # the other observers saw every event
    assert num_deltas >= 7 and errors == {"flaky-dashboard": num_deltas}
    assert len(events.of(Finished)) == 2
    assert "observer flaky-dashboard raised on TokensEmitted" in caplog.text and "dashboard is down" in caplog.text
