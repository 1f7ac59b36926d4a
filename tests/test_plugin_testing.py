"""modelcall.testing: kernels with exactly the plugins a test names, the event collector, the scripted sampler."""
import pytest

from modelcall.events import Finished, RequestAdmitted, TokensEmitted
from modelcall.testing import ScriptedSampler, installed_plugin_names, kernel_for_test

pytestmark = pytest.mark.anyio


@pytest.fixture
def third_party_plugin(tmp_path, monkeypatch):
    """An installed third-party plugin (a dist-info on sys.path) that registers an observer."""
    dist = tmp_path / "mc_thirdparty-2.5.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mc-thirdparty\nVersion: 2.5\n")
    (dist / "entry_points.txt").write_text("[modelcall]\nmc_thirdparty = mc_thirdparty\n")
    (tmp_path / "mc_thirdparty.py").write_text(
        "from modelcall.core import hookimpl\nfrom modelcall.events import Finished\nSEEN = []\n\n"
        "@hookimpl\ndef register_observers(register):\n    register(Finished, SEEN.append)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "mc_thirdparty"


async def test_test_kernels_leave_out_installed_third_party_plugins_unless_asked(third_party_plugin):
    assert third_party_plugin in installed_plugin_names()
    async with kernel_for_test() as kernel:
        assert third_party_plugin not in kernel.host.names()
        assert "torch_runner" in kernel.host.names()  # the built-ins are there
    async with kernel_for_test(installed=True) as kernel:
        assert third_party_plugin in kernel.host.names()
    async with kernel_for_test(plugins=[third_party_plugin]) as kernel:  # named: loaded, with its version
        row = next(r for r in kernel.host.describe() if r["name"] == third_party_plugin)
        assert (row["distribution"], row["version"]) == ("mc-thirdparty", "2.5")
        await kernel.complete("hi", max_tokens=2)
    import mc_thirdparty
    assert len(mc_thirdparty.SEEN) == 1


async def test_the_events_fixture_sees_every_kernel_of_the_test_in_order(make_kernel, events):
    async with make_kernel() as first:
        a = await first.complete("one", max_tokens=2, ignore_eos=True)
    async with make_kernel() as second:
        b = await second.complete("two", max_tokens=3, ignore_eos=True)
    assert events.completion_order() == [a.request_id, b.request_id]
    assert events.names(a.request_id)[0] == "RequestAdmitted" and events.names(b.request_id)[-1] == "Finished"
    assert len(events.of(TokensEmitted)) >= 5 and len(events.of(RequestAdmitted)) == 2


async def test_the_scripted_sampler_makes_the_model_say_the_script_then_stop(make_kernel):
    sampler = ScriptedSampler()
    async with make_kernel(plugins=[sampler]) as kernel:
        sampler.say(kernel.tokenizer.encode("Bonjour, monde! 你好"))
        done = await kernel.complete("hi", max_tokens=64)
        sampler.say(kernel.tokenizer.encode("x"), request_id="only-me")
        other = await kernel.complete("hi", request_id="only-me", max_tokens=64)
    assert (done.text, done.finish_reason) == ("Bonjour, monde! 你好", "stop")
    assert (other.text, other.finish_reason) == ("x", "stop")
    assert isinstance(done.finished, Finished)
