"""Shortest prompt first: with one slot, queued requests complete shortest prompt first."""
import pytest

import modelcall_spf
from modelcall.events import Finished, Preempted, PrefillDone

pytestmark = pytest.mark.anyio

# prompt lengths in arrival order: long, short, medium, tiny
PROMPTS = {"long": list(range(10, 70)), "short": list(range(10, 20)), "medium": list(range(10, 40)),
           "tiny": [10, 11, 12]}


async def run_burst(make_kernel, plugins, **config):
    """While a long request holds the only slot, queue every prompt; return (completion order, texts)."""
    async with make_kernel(plugins=plugins, **{"max_num_seqs": 1, **config}) as kernel:
        blocker = await kernel.submit(prompt_token_ids=[5, 6, 7], request_id="blocker", max_tokens=64,
                                      ignore_eos=True)
        async for ev in blocker:
            if isinstance(ev, PrefillDone):
                break  # it runs: everything submitted now waits in the queue
        handles = [await kernel.submit(prompt_token_ids=ids, request_id=name, max_tokens=6,
                                       temperature=0, ignore_eos=True) for name, ids in PROMPTS.items()]
        results = {h.request_id: await h.result() for h in handles}
        await blocker.result()
        assert kernel.kv.num_free_blocks() == kernel.kv.num_blocks  # nothing leaked
        order = sorted(results, key=lambda rid: results[rid].finished.timings.finished)
        return order, {rid: c.text for rid, c in results.items()}


async def test_spf_completes_requests_shortest_prompt_first_where_the_builtin_keeps_arrival_order(make_kernel):
    spf_order, spf_texts = await run_burst(make_kernel, [modelcall_spf])
    fcfs_order, fcfs_texts = await run_burst(make_kernel, [])
    assert fcfs_order == ["long", "short", "medium", "tiny"]
    assert spf_order == ["tiny", "short", "medium", "long"]
    assert spf_texts == fcfs_texts  # only the order changed, not what was computed


async def test_spf_is_the_waiting_queue_that_answered_and_declines_when_another_is_named(make_kernel):
    async with make_kernel(plugins=[modelcall_spf]) as kernel:
        assert kernel.host.providers["waiting_queue"] == "modelcall_spf"
        assert kernel.host.providers["scheduler"] != "modelcall_spf"  # the built-in scheduler, our order
    async with make_kernel(plugins=[modelcall_spf], waiting_queue="default") as kernel:
        assert kernel.host.providers["waiting_queue"] != "modelcall_spf"


def test_the_queue_orders_by_prompt_length_and_puts_preempted_requests_first():
    from modelcall.core import Request, SamplingParams, WaitingQueue

    def req(rid, n):
        return Request(rid, list(range(3, 3 + n)), SamplingParams.create(), max_tokens=1)

    q = modelcall_spf.ShortestPromptFirst()
    assert isinstance(q, WaitingQueue)
    long, short, tiny, ran = req("long", 50), req("short", 10), req("tiny", 3), req("ran", 40)
    for r in (long, short, tiny):
        q.push(r)
    q.push_front(ran)
    assert [r.request_id for r in q] == ["ran", "tiny", "short", "long"] and len(q) == 4
    assert q.remove(tiny) and not q.remove(tiny) and q.get("tiny") is None and q.get("long") is long
    assert q.pop() is ran and q.peek() is short and q.pop() is short and q.pop() is long and len(q) == 0


async def generate_all(make_kernel, **config):
    async with make_kernel(plugins=[modelcall_spf], max_num_seqs=4, **config) as kernel:
        handles = [await kernel.submit(prompt_token_ids=list(range(10 + i, 30 + i)), request_id=f"r{i}",
                                       max_tokens=24, temperature=0, ignore_eos=True) for i in range(4)]
        texts = {h.request_id: (await h.result()).text for h in handles}
        assert kernel.kv.num_free_blocks() == kernel.kv.num_blocks
        return texts


async def test_preemption_under_a_tiny_kv_pool_recomputes_and_loses_nothing(make_kernel, events):
    # four requests of 20 + 24 tokens need 12 blocks of 16 at the end; the pool has 8
    squeezed = await generate_all(make_kernel, num_kv_blocks=8, block_size=16)
    assert events.of(Preempted), "the pool was meant to be too small for all four at once"
    roomy = await generate_all(make_kernel, num_kv_blocks=64, block_size=16)
    assert squeezed == roomy
