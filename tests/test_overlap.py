"""Async scheduling (core/engine.py, Engine._step's held step): step N's output stage runs while step N+1's
forward computes, and it changes nothing a client can see: greedy outputs equal transformers' under
chunked prefill and preemption, stops and aborts land exactly (no token past a stop is emitted or
metered, each request's events in order, every block given back), and the overlap really happens
(tokens are published while the next forward runs). Decode bursts (core/burst.py, tested in
test_decode_bursts.py) are turned off here: a burst's tokens are never held, so an abort or a stop lands after
the burst, not after one step."""
from __future__ import annotations

import threading

import anyio
import pytest
from greedy_refs import greedy_continuations, prompts_with_a_shared_prefix
from kv_invariants import check_whole

from modelcall.core import hookimpl
from modelcall.events import Finished, Preempted, PrefillDone, RequestScheduled, StepDone, TokensEmitted

pytestmark = pytest.mark.anyio

MAX_TOKENS = 12
PROMPTS = prompts_with_a_shared_prefix(seed=21, prefix=36, shortest_own=1)


@pytest.fixture(scope="module")
def references(demo_model_dir) -> list[list[int]]:
    return greedy_continuations(demo_model_dir, PROMPTS, MAX_TOKENS)


def _whole(kernel) -> None:
    check_whole(kernel.kv)
    assert kernel.scheduler.num_running == 0 and kernel.scheduler.num_waiting == 0


def _check_request_events(events, request_id: str, completion_tokens: int) -> None:
    """A request's own events in order, nothing after its end, and exactly its metered tokens emitted."""
    mine = events.for_request(request_id)
    kinds = [type(e) for e in mine]
    assert kinds.count(Finished) == 1 and kinds[-1] is Finished, kinds
    if PrefillDone in kinds:
        assert kinds.index(RequestScheduled) < kinds.index(PrefillDone)
        first_tokens = [i for i, k in enumerate(kinds) if k is TokensEmitted]
        assert not first_tokens or kinds.index(PrefillDone) < first_tokens[0]
    emitted = sum(len(e.token_ids) for e in mine if type(e) is TokensEmitted)
    assert emitted == completion_tokens == mine[-1].usage.completion_tokens


async def test_greedy_outputs_equal_generate_under_preemption_with_overlap(make_kernel, events, references,
                                                                           demo_model_dir):
    async with make_kernel(model=demo_model_dir, async_scheduling=True, num_scheduler_steps=1, block_size=16, num_kv_blocks=6,
                           max_num_batched_tokens=16) as kernel:
        results: dict[int, object] = {}

        async def one(i: int) -> None:
            await anyio.sleep(0.01 * (i % 3))
            results[i] = await kernel.complete(prompt_token_ids=PROMPTS[i], max_tokens=MAX_TOKENS, temperature=0,
                                               ignore_eos=True)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for i in range(len(PROMPTS)):
                    tg.start_soon(one, i)
        _whole(kernel)
    for i, done in results.items():
        assert done.token_ids == references[i], f"prompt {i}"
        assert done.finish_reason == "length" and done.usage.completion_tokens == MAX_TOKENS
        _check_request_events(events, done.request_id, MAX_TOKENS)
    assert events.of(Preempted), "the pool was meant to force preemption"
    steps = [e.step for e in events.of(StepDone)]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)


async def _stopped_runs(kernel, reference: list[int], text: str) -> list:
    """The same prompt ended three ways: a stop token id, a stop string and max_tokens."""
    p = PROMPTS[0]
    stop_string = text[len(text) // 2:len(text) // 2 + 2] if len(text) > 4 else text[-1:]
    asks = [dict(stop_token_ids=[reference[4]]), dict(stop=[stop_string]), dict(max_tokens=3)]
    runs = []
    async with anyio.create_task_group() as tg:
        async def one(k: int, prompt: list[int], ask: dict) -> None:
            fields = {"max_tokens": MAX_TOKENS, **ask}
            runs.append((k, await kernel.complete(prompt_token_ids=prompt, temperature=0, ignore_eos=True, **fields)))

        for k, ask in enumerate(asks):
            tg.start_soon(one, k, p, ask)
        # beside them, requests that run on (their rows keep the batch going while the others stop)
        for q in PROMPTS[3:]:
            tg.start_soon(one, 99, q, {})
    return [done for k, done in sorted(runs, key=lambda r: r[0]) if k != 99]


async def test_stops_land_exactly_as_without_overlap(make_kernel, events, demo_model_dir):
    outs = {}
    for overlap in (False, True):
        async with make_kernel(model=demo_model_dir, async_scheduling=overlap, num_scheduler_steps=1) as kernel:
            plain = await kernel.complete(prompt_token_ids=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0,
                                          ignore_eos=True)
            outs[overlap] = await _stopped_runs(kernel, plain.token_ids, plain.text)
            _whole(kernel)
    for off, on in zip(outs[False], outs[True]):
        assert (on.token_ids, on.text, on.finish_reason, on.usage.completion_tokens) == \
               (off.token_ids, off.text, off.finish_reason, off.usage.completion_tokens)
    by_token, by_string, by_length = outs[True]
    assert by_token.finish_reason == "stop" and len(by_token.token_ids) == 5  # the stop token is its last
    assert by_string.finish_reason == "stop" and by_length.usage.completion_tokens == 3
    for done in outs[True]:
        _check_request_events(events, done.request_id, done.usage.completion_tokens)


class AbortAt:
    """Aborts request i right as its i-th token is published: during the next forward (with overlap),
    when that request already holds a row of it."""

    def __init__(self) -> None:
        self.handles: dict[str, tuple[int, object]] = {}
        self.counts: dict[str, int] = {}

    @hookimpl
    def register_observers(self, register) -> None:
        register(TokensEmitted, self.on_tokens, name="test.abort_at")

    def on_tokens(self, ev: TokensEmitted) -> None:
        n = self.counts[ev.request_id] = self.counts.get(ev.request_id, 0) + len(ev.token_ids)
        i, handle = self.handles.get(ev.request_id, (0, None))
        if handle is not None and n == i:
            handle.abort()


async def test_aborts_meter_only_emitted_tokens_and_free_every_block(make_kernel, events, demo_model_dir):
    aborter = AbortAt()
    async with make_kernel(plugins=[aborter], model=demo_model_dir, async_scheduling=True, num_scheduler_steps=1, block_size=16,
                           num_kv_blocks=8, max_num_batched_tokens=24) as kernel:
        handles = [await kernel.submit(prompt_token_ids=p, max_tokens=40, temperature=0, ignore_eos=True)
                   for p in PROMPTS]
        for i, h in enumerate(handles):
            if i % 2:
                aborter.handles[h.request_id] = (i, h)
        with anyio.fail_after(60):
            done = [await h.result() for h in handles]
        _whole(kernel)
    for i, c in enumerate(done):
        assert c.finish_reason == ("abort" if i % 2 else "length")
        # metered = emitted: the i tokens published before the abort, and none of the row it held
        assert c.usage.completion_tokens == len(c.token_ids) == (i if i % 2 else 40)
        _check_request_events(events, c.request_id, c.usage.completion_tokens)


class ForwardProbe:
    """Notes, as each TokensEmitted is published, whether a forward runs in the worker thread meanwhile.

    NOTE: on a loaded machine a tiny model's forward can end before the loop gets to publish, so the
    forward is held (up to `hold_s`) until the probe has looked: with overlap the look happens while
    it is held (True); without, the loop only publishes after the forward returned (False) and the
    held forward just runs late. `patience_s` covers the worker thread's start."""

    def __init__(self, patience_s: float, until_seen: bool = False) -> None:
        self.busy = threading.Event()
        self.looked = threading.Event()
        self.patience_s = patience_s
        self.until_seen = until_seen   # a test that needs one overlapping token: no waiting once one was seen
        self.seen: list[bool] = []

    def observe(self, ev: TokensEmitted) -> None:
        patience = 0.0 if self.until_seen and any(self.seen) else self.patience_s
        self.seen.append(self.busy.wait(patience))
        self.looked.set()

    def hold(self, execute, hold_s: float):
        forwards = [0]

        def held(plan):
            self.busy.set()
            try:
                # NOTE: the first forward (the prefill) has no token before it to be published meanwhile:
                # held, it only waited out hold_s (2 s with overlap) for a look that could not come.
                if forwards[0]:
                    self.looked.wait(hold_s)
                self.looked.clear()
                forwards[0] += 1
                return execute(plan)
            finally:
                self.busy.clear()
        return held

    @hookimpl
    def register_observers(self, register) -> None:
        register(TokensEmitted, self.observe, name="test.forward_probe")


@pytest.mark.parametrize("overlap", [True, False])
async def test_tokens_are_published_while_the_next_forward_runs_only_with_overlap(make_kernel, demo_model_dir,
                                                                                   overlap):
    # without overlap a longer patience would only slow the test: the loop that publishes is the one
    # that would start the next forward, so no forward can run meanwhile however long it waits
    probe = ForwardProbe(patience_s=2.0 if overlap else 0.05)
    seen = probe.seen

    async with make_kernel(plugins=[probe], model=demo_model_dir, async_scheduling=overlap, num_scheduler_steps=1) as kernel:
        kernel.engine.runner.execute = probe.hold(kernel.runner.execute, hold_s=2.0 if overlap else 0.05)  # type: ignore[method-assign]
        handle = await kernel.submit(prompt_token_ids=PROMPTS[1], max_tokens=MAX_TOKENS, temperature=0,
                                     ignore_eos=True)
        await handle.result()
    assert len(seen) == MAX_TOKENS
    if overlap:  # every token but the last (its length limit ends it before another step) overlaps
        assert seen == [True] * (MAX_TOKENS - 1) + [False], seen
    else:
        assert not any(seen), seen
