"""The kernel end to end on the demo model: events in order, usage that matches, abort, isolation, bad input."""
import textwrap

import pytest

from modelcall.core import ContextOverflow, InvalidRequest, Kernel, ModelNotFound, hookimpl
from modelcall.events import (
    Finished, PrefillDone, RequestAdmitted, RequestQueued, RequestScheduled, TokensEmitted,
)

pytestmark = pytest.mark.anyio
CFG = dict(dtype="float32", num_kv_blocks=256, block_size=16)


async def test_events_arrive_in_stage_order_with_usage_equal_to_the_tokens_seen(demo_model_dir):
    async with Kernel(model=demo_model_dir, **CFG) as kernel:
        events = [ev async for ev in kernel.generate("def main():", max_tokens=12, temperature=0,
                                                      ignore_eos=True, task_id="task-1")]
    kinds = [type(e) for e in events]
    assert kinds[:4] == [RequestAdmitted, RequestQueued, RequestScheduled, PrefillDone]
    assert kinds[-1] is Finished and set(kinds[4:-1]) == {TokensEmitted}
    assert all(a.ts <= b.ts for a, b in zip(events, events[1:]))
    assert {e.task_id for e in events} == {"task-1"}
    fin = events[-1]
    tokens = [t for e in events if isinstance(e, TokensEmitted) for t in e.token_ids]
    assert fin.reason == "length" and fin.usage.completion_tokens == len(tokens) == 12
    assert fin.usage.prompt_tokens == events[0].prompt_tokens > 0
    assert fin.text == "".join(e.text for e in events if isinstance(e, TokensEmitted))
    t = fin.timings
    assert t.received <= t.admitted <= t.scheduled <= t.first_token <= t.last_token <= t.finished


async def test_abort_ends_a_request_with_its_own_reason_and_frees_its_blocks(demo_model_dir):
    async with Kernel(model=demo_model_dir, **CFG) as kernel:
        handle = await kernel.submit("import os", max_tokens=2000, ignore_eos=True)
        seen = 0
        async for ev in handle:
            if isinstance(ev, TokensEmitted):
                seen += 1
                if seen == 3:
                    kernel.abort(handle.request_id)
            if isinstance(ev, Finished):
                assert ev.reason == "abort" and ev.usage.completion_tokens >= 3
        assert kernel.kv.num_free_blocks() == kernel.kv.num_blocks
        assert kernel.stats()["unfinished"] == 0


async def test_leaving_the_loop_early_aborts_the_request(demo_model_dir):
    async with Kernel(model=demo_model_dir, **CFG) as kernel:
        async for ev in kernel.generate("class A:", max_tokens=2000, ignore_eos=True):
            if isinstance(ev, TokensEmitted):
                break
        fin = await kernel.complete("x = 1", max_tokens=4, temperature=0)  # the engine keeps serving
        assert fin.finish_reason == "length"
        assert kernel.stats()["unfinished"] == 0
        assert kernel.kv.num_free_blocks() == kernel.kv.num_blocks


async def test_bad_input_is_a_clear_error_naming_the_field(demo_model_dir):
    async with Kernel(model=demo_model_dir, **CFG) as kernel:
        for kwargs, field in [
            (dict(prompt=""), "prompt"),
            (dict(prompt="hi", max_tokens=-3), "max_tokens"),
            (dict(prompt="hi", top_p=1.5), "top_p"),
            (dict(messages=[]), "messages"),
            (dict(prompt_token_ids=[1, 10**9]), "prompt_token_ids"),
            (dict(prompt="a", prompt_token_ids=[1]), "prompt"),
        ]:
            with pytest.raises(InvalidRequest) as e:
                await kernel.complete(**kwargs)
            assert e.value.field == field, (kwargs, e.value)
        window = kernel.window
        with pytest.raises(ContextOverflow) as e:
            await kernel.complete("hello", max_tokens=window)
        assert e.value.window == window and e.value.max_tokens == window and str(window) in str(e.value)
        assert (await kernel.complete("still serving", max_tokens=2)).usage.completion_tokens == 2


async def test_an_unknown_model_path_is_a_clear_error():
    with pytest.raises(ModelNotFound, match="/no/such/model"):
        async with Kernel(model="/no/such/model"):
            pass


class ByteTokenizer:
    """A tokenizer of raw UTF-8 bytes (ids 0-255): enough to tell it from the built-in one."""

    name = "bytes"
    eos_token_ids = frozenset()
    vocab_size = 256

    def encode(self, text, *, add_special_tokens=False):
        return list(text.encode())

    def decode(self, token_ids, *, skip_special_tokens=True):
        return bytes(t for t in token_ids if t < 256).decode(errors="replace")

    def apply_chat_template(self, messages, *, tools=None, add_generation_prompt=True, **kw):
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages)

    def detokenizer(self, prompt_token_ids, *, skip_special_tokens=True):
        import codecs

        class Detok:
            dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

            def push(self, ids):
                return self.dec.decode(bytes(t for t in ids if t < 256))

            def flush(self):
                return self.dec.decode(b"", final=True)

        return Detok()


def _install_plugin(tmp_path, monkeypatch, source: str, name: str) -> None:
    """Install a plugin distribution the way pip would leave it: a module and a dist-info with an entry point."""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    info = tmp_path / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[modelcall]\n{name} = {name}\n")
    monkeypatch.syspath_prepend(str(tmp_path))


BYTE_PLUGIN = '''
from modelcall.core import hookimpl
import test_kernel

@hookimpl
def provide_tokenizer(config):
    return test_kernel.ByteTokenizer()
'''


async def test_an_installed_plugin_overrides_the_builtin_tokenizer_and_p_no_blocks_it(
        demo_model_dir, tmp_path, monkeypatch):
    _install_plugin(tmp_path, monkeypatch, BYTE_PLUGIN, "mc_bytetok")
    async with Kernel(model=demo_model_dir, **CFG) as kernel:
        assert "mc_bytetok" in kernel.host.names()
        assert kernel.tokenizer.name == "bytes"
        fin = await kernel.complete("héllo", max_tokens=2, temperature=0)
        assert fin.usage.prompt_tokens == len("héllo".encode())
    async with Kernel(model=demo_model_dir, blocked=["no:mc_bytetok"], **CFG) as kernel:
        assert "mc_bytetok" not in kernel.host.names()
        assert kernel.tokenizer.name != "bytes"


async def test_two_kernels_in_one_process_share_no_plugins_or_state(demo_model_dir):
    class Counter:
        modelcall_plugin_name = "counter"

        def __init__(self):
            self.seen = []

        @hookimpl
        def register_observers(self, register):
            register(Finished, self.seen.append)

    counter = Counter()
    async with Kernel(model=demo_model_dir, plugins=[counter], **CFG) as a, \
            Kernel(model=demo_model_dir, **CFG) as b:
        assert "counter" in a.host.names() and "counter" not in b.host.names()
        await b.complete("one", max_tokens=2)
        assert counter.seen == []
        await a.complete("two", max_tokens=2)
        assert len(counter.seen) == 1
        assert a.kv is not b.kv and a.scheduler is not b.scheduler
        assert a.stats()["steps"] >= 2 and b.stats()["steps"] >= 2


async def test_a_started_kernel_keeps_its_loaded_objects_out_of_the_collector_until_it_stops(demo_model_dir):
    import gc
    import torch
    async with Kernel(model=demo_model_dir, **CFG) as kernel:
        frozen = gc.get_freeze_count()
        weight = next(kernel.runner.model.parameters())
        # the model's modules were frozen at start: a full collection walks none of them
        assert frozen > 1000 and not any(o is weight for o in gc.get_objects(generation=2))
        events = [ev async for ev in kernel.generate("def main():", max_tokens=4, temperature=0, ignore_eos=True)]
        assert isinstance(events[-1], Finished) and gc.get_freeze_count() > 1000   # still frozen while serving
    assert gc.get_freeze_count() == 0   # thawed at stop: a stopped kernel's cycles are collected again
    assert isinstance(weight, torch.Tensor)
