"""Decode bursts (core/burst.py): several decode steps in one runner call change nothing a client sees but the
timing. Greedy outputs equal transformers' `generate`, seeded sampling equals the single-step engine's, stops
and length limits land on the same token, a request arriving mid-burst is served, no block stays held, and
every token keeps its own step's time. Requests whose sampling reads their own tokens never burst."""
from __future__ import annotations

import random

import anyio
import pytest
from greedy_refs import greedy_continuations
from kv_invariants import check_whole

from modelcall.core import ConfigError, KernelConfig
from modelcall.events import StepDone, TokensEmitted

pytestmark = pytest.mark.anyio

_rng = random.Random(77)
PROMPTS = [[_rng.randrange(10, 2048) for _ in range(_rng.randrange(5, 40))] for _ in range(4)]
MAX_TOKENS = [24, 9, 31, 17]   # unequal: a burst is cut to the fewest tokens any request has left


@pytest.fixture(scope="module")
def references(demo_model_dir) -> list[list[int]]:
    return greedy_continuations(demo_model_dir, PROMPTS, max(MAX_TOKENS))


def _burst_sizes(events) -> list[int]:
    return [e.num_steps for e in events.of(StepDone)]


async def _all(kernel, delays=(0, 0, 0, 0), **fields) -> list:
    out: list = [None] * len(PROMPTS)

    async def one(i: int) -> None:
        await anyio.sleep(delays[i])
        out[i] = await kernel.complete(prompt_token_ids=PROMPTS[i], max_tokens=MAX_TOKENS[i], **fields)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for i in range(len(PROMPTS)):
                tg.start_soon(one, i)
    return out


async def test_greedy_bursts_equal_generate_and_late_arrivals_are_served(make_kernel, events, demo_model_dir,
                                                                        references):
    # the third request arrives while the first two decode in bursts; the fourth after the second has ended
    async with make_kernel(model=demo_model_dir, block_size=4, num_kv_blocks=96) as kernel:
        done = await _all(kernel, delays=(0, 0, 0.05, 0.12), temperature=0, ignore_eos=True)
        check_whole(kernel.kv)
    for i, d in enumerate(done):
        assert d.token_ids == references[i][:MAX_TOKENS[i]], f"prompt {i}"
        assert d.finish_reason == "length" and d.usage.completion_tokens == MAX_TOKENS[i]
    sizes = _burst_sizes(events)
    assert max(sizes) > 1, sizes
    # StepDone counts every forward: tokens = the requests' prompt and output tokens, less each last sampled one
    # (never fed back); plus a burst's dropped rows, none here (no stop ends a request mid-burst)
    fed = sum(len(p) + m - 1 for p, m in zip(PROMPTS, MAX_TOKENS))
    assert sum(e.num_tokens for e in events.of(StepDone)) == fed


async def test_seeded_sampling_and_stops_match_single_steps(make_kernel, events, demo_model_dir, references):
    # a stop token taken from the reference's middle ends request 2 inside a burst
    stop = references[2][13]
    runs = {}
    for steps in (1, 8):
        events.events.clear()
        async with make_kernel(model=demo_model_dir, num_scheduler_steps=steps) as kernel:
            sampled = await _all(kernel, temperature=0.9, top_p=0.95, seed=11, ignore_eos=True)
            stopped = await kernel.complete(prompt_token_ids=PROMPTS[2], max_tokens=31, temperature=0,
                                            stop_token_ids=[stop])
            check_whole(kernel.kv)
        runs[steps] = ([d.token_ids for d in sampled], stopped.token_ids, stopped.finish_reason,
                       stopped.usage.completion_tokens, _burst_sizes(events))
    single, burst = runs[1], runs[8]
    assert max(single[4]) == 1 and max(burst[4]) > 1
    assert burst[:4] == single[:4]
    cut = references[2].index(stop)
    assert burst[1] == references[2][:cut + 1] and burst[2] == "stop" and burst[3] == cut + 1


async def test_tokens_keep_their_own_step_times(make_kernel, events, demo_model_dir):
    async with make_kernel(model=demo_model_dir) as kernel:
        await kernel.complete(prompt_token_ids=PROMPTS[0], max_tokens=40, temperature=0, ignore_eos=True)
    bursts = [e for e in events.of(StepDone) if e.num_steps > 1]
    assert bursts
    times = [e.ts for e in events.of(TokensEmitted) if e.token_ids]
    assert times == sorted(times)
    # one burst's tokens reach the bus together, yet each carries the time its step ended
    assert len(set(times)) == len(times), "tokens of one burst share a timestamp"


@pytest.mark.parametrize("fields", [{"logprobs": 2}, {"repetition_penalty": 1.3}, {"frequency_penalty": 0.5},
                                    {"min_tokens": 30}])
async def test_requests_whose_sampling_reads_their_tokens_never_burst(make_kernel, events, demo_model_dir, fields):
    async with make_kernel(model=demo_model_dir) as kernel:
        d = await kernel.complete(prompt_token_ids=PROMPTS[1], max_tokens=32, temperature=0, **fields)
    assert d.usage.completion_tokens >= (30 if "min_tokens" in fields else 1)
    sizes = _burst_sizes(events)
    if "min_tokens" in fields:   # bursts only once min_tokens is met (the EOS ban no longer depends on the count)
        steps_before = [e.num_steps for e in events.of(StepDone)][:30]
        assert steps_before == [1] * len(steps_before)
    else:
        assert sizes == [1] * len(sizes)


async def test_bursts_off_runs_single_steps(make_kernel, events, demo_model_dir, references):
    async with make_kernel(model=demo_model_dir, num_scheduler_steps=1) as kernel:
        d = await kernel.complete(prompt_token_ids=PROMPTS[3], max_tokens=17, temperature=0, ignore_eos=True)
    assert d.token_ids == references[3][:17]
    assert _burst_sizes(events) == [1] * 17   # the prefill (first token) and 16 decode steps


def test_config_refuses_a_burst_of_no_steps():
    with pytest.raises(ConfigError, match="num_scheduler_steps"):
        KernelConfig(num_scheduler_steps=0)
    with pytest.raises(ConfigError, match="burst_budget_ms"):
        KernelConfig(burst_budget_ms=-1)


async def test_an_abort_lands_after_the_burst_and_meters_what_was_emitted(make_kernel, events, demo_model_dir):
    async with make_kernel(model=demo_model_dir, block_size=4, num_kv_blocks=64) as kernel:
        handle = await kernel.submit(prompt_token_ids=PROMPTS[0], max_tokens=200, temperature=0, ignore_eos=True)
        read: list[int] = []
        with anyio.fail_after(30):
            while len(read) < 12:
                ev = await handle.__anext__()
                read += ev.token_ids if isinstance(ev, TokensEmitted) else []
            handle.abort()
            done = await handle.result()   # the rest of the stream: what was emitted before the abort landed
        check_whole(kernel.kv)
        assert kernel.scheduler.num_running == 0
    assert max(_burst_sizes(events)) > 1
    emitted = [t for e in events.of(TokensEmitted) for t in e.token_ids]
    got = read + done.token_ids
    assert done.finish_reason == "abort" and 12 <= len(got) < 200
    assert done.usage.completion_tokens == len(got) and got == emitted   # metered = emitted = what the client got
