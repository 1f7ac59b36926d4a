"""modelcall.testing: helpers and pytest fixtures for testing modelcall plugins.

    async with kernel_for_test(plugins=[my_plugin], max_num_seqs=1) as kernel:
        completion = await kernel.complete("Hello", max_tokens=4)

The pytest fixtures (`make_kernel`, `events`, `live_server`) live in `modelcall.testing.fixtures`,
which pytest loads by itself once modelcall is installed (entry point `pytest11`).
"""
from modelcall.testing.collector import EventCollector
from modelcall.testing.kernels import TEST_CONFIG, installed_plugin_names, kernel_for_test
from modelcall.testing.scripted import ScriptedSampler
from modelcall.testing.server import LiveServer, serve_kernel, server_for_test

__all__ = ["TEST_CONFIG", "EventCollector", "LiveServer", "ScriptedSampler", "installed_plugin_names",
           "kernel_for_test", "serve_kernel", "server_for_test"]
