"""The typed request of `Kernel.submit` (core/submit.py) and n > 1 in-process: the keyword form builds the
same GenerateRequest, a request crosses the wire as data, and the n choices of one request share one
prefill (cached tokens, one prefill step, the prompt charged once) while each samples with seed + i."""
from __future__ import annotations

import anyio
import msgspec
import pytest
from kv_invariants import check_whole

from modelcall.core import InvalidRequest, Overloaded, SamplingParams, hookimpl
from modelcall.core.submit import Choice, GenerateRequest
from modelcall.events import Finished, RequestScheduled, StepDone
from modelcall.plugins.scale import wire

pytestmark = pytest.mark.anyio

PROMPT = [(11 * i) % 1500 + 100 for i in range(40)]  # 40 = 2 full blocks of 16 and a partial one


async def _tokens(handles) -> list[list[int]]:
    outs: list = [None] * len(handles)

    async def read(i: int) -> None:
        outs[i] = (await handles[i].result()).token_ids

    async with anyio.create_task_group() as tg:
        for i in range(len(handles)):
            tg.start_soon(read, i)
    return outs


def test_the_keyword_form_builds_the_typed_request_and_it_crosses_the_wire_as_data():
    from modelcall.core.submit import as_request

    r = as_request("hi", {"max_tokens": 3, "seed": 1, "task_id": "t", "n": 2})
    assert r == GenerateRequest(prompt="hi", task_id="t", n=2, param_fields={"max_tokens": 3, "seed": 1})
    typed = msgspec.structs.replace(r, params=SamplingParams(seed=4))
    call = wire.Call(request=typed, choice=Choice(forks=1, sequences=2))
    assert wire.decode_call(wire.encode(call)) == call
    with pytest.raises(InvalidRequest, match="n must be at least 1"):
        GenerateRequest(prompt="x", n=0)
    with pytest.raises(InvalidRequest, match="given twice"):
        as_request("x", {"prompt": "y"})


async def test_a_typed_request_and_its_keyword_form_give_the_same_completion(make_kernel, demo_model_dir):
    async with make_kernel(model=demo_model_dir) as kernel:
        typed = await kernel.complete(GenerateRequest(prompt_token_ids=PROMPT, params=SamplingParams(
            max_tokens=5, temperature=0, ignore_eos=True)))
        loose = await kernel.complete(prompt_token_ids=PROMPT, max_tokens=5, temperature=0, ignore_eos=True)
        with pytest.raises(InvalidRequest, match="use submit_choices"):
            await kernel.submit(GenerateRequest(prompt="x", n=2))
    assert typed.token_ids == loose.token_ids and len(typed.token_ids) == 5


async def test_n_choices_in_process_share_one_prefill_and_sample_with_seed_plus_i(make_kernel, events, demo_model_dir):
    n, max_tokens = 4, 5
    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=21, ignore_eos=True)
    async with make_kernel(model=demo_model_dir, block_size=16) as kernel:
        handles = await kernel.submit_choices(GenerateRequest(prompt_token_ids=PROMPT, params=params, n=n))
        shared = await _tokens(handles)
        steps = [e for e in events.events if type(e) is StepDone]
        ids = [h.request_id for h in handles]
        finished = {e.request_id: e for e in events.events if type(e) is Finished}
        scheduled = {e.request_id: e for e in events.events if type(e) is RequestScheduled}
        again = await _tokens(await kernel.submit_choices(prompt_token_ids=PROMPT, n=n, max_tokens=max_tokens,
                                                          temperature=1.0, seed=21, ignore_eos=True))
        alone = [await kernel.complete(prompt_token_ids=PROMPT, params=msgspec.structs.replace(params, seed=21 + i))
                 for i in range(n)]
        check_whole(kernel.kv)
    assert sum(s.num_steps for s in steps) == max_tokens   # one prefill step for all n, then decode
    assert sum(s.num_tokens for s in steps) == len(PROMPT) + n * (max_tokens - 1)  # the prompt computed once
    assert [finished[r].usage.prompt_tokens for r in ids] == [len(PROMPT)] + [0] * (n - 1)  # charged once
    assert all(scheduled[r].cached_tokens == 0 for r in ids)  # forked, not recomputed from the prefix cache
    assert len({tuple(t) for t in shared}) == n                           # n distinct samples
    assert shared == again == [c.token_ids for c in alone]                # seeded: choice i draws seed + i


async def test_a_refused_choice_closes_the_choices_admitted_before_it(make_kernel, events, demo_model_dir):
    class RefuseForks:
        modelcall_plugin_name = "refuse-forks"

        def reserve(self, adm) -> None:
            if adm.prompt_tokens == 0:  # a fork of n > 1 (its prompt is charged to the first choice)
                raise Overloaded("no forks today")

        def observe(self, ev) -> None:
            pass

        @hookimpl
        def register_meters(self, register) -> None:
            register(self)

    async with make_kernel(plugins=[RefuseForks()], model=demo_model_dir) as kernel:
        # NOTE: the kept traceback keeps submit_choices' frame, so its handles are not closed by the
        # garbage collector: only submit_choices' own close ends the first choice.
        with pytest.raises(Overloaded) as refused:
            await kernel.submit_choices(prompt_token_ids=PROMPT, n=3, max_tokens=4)
        with anyio.fail_after(5):
            while kernel.engine.num_unfinished:
                await anyio.sleep(0.01)
        check_whole(kernel.kv)
    ends = [e for e in events.events if type(e) is Finished]
    assert [e.reason for e in ends] == ["abort"] and refused.value  # the first choice, held for its forks, aborted


async def test_every_choice_of_a_chat_request_has_its_reasoning_split(make_kernel):
    from modelcall.testing.scripted import ScriptedSampler

    sampler = ScriptedSampler()
    async with make_kernel(plugins=[sampler]) as kernel:
        sampler.say(kernel.tokenizer.encode("<think>\nweighing it\n</think>\n\nHello"))
        handles = await kernel.submit_choices(messages=[{"role": "user", "content": "hi"}], n=3, max_tokens=32)
        done = [await h.result() for h in handles]
    # NOTE: choices after the first are given the first's token ids, yet their output stage is a chat one
    assert [(c.reasoning.strip(), c.text) for c in done] == [("weighing it", "Hello")] * 3
    assert [c.finished.usage.reasoning_tokens > 0 for c in done] == [True] * 3
