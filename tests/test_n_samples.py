"""n > 1: the prompt is prefilled once and its K/V shared by the samples (full blocks shared, the
last partial block copied on write); each sample still draws exactly what it would alone, and the
prompt is charged once (usage, quota)."""
from __future__ import annotations

import itertools

import anyio
import pytest
import requests
from kv_invariants import check_pool, check_whole

from modelcall.core import Kernel, Request, SamplingParams, Status, hookimpl
from modelcall.events import StepDone
from modelcall.plugins.kv_cache import PagedKVCache
from modelcall.plugins.scheduler import DefaultScheduler

from http_server import ServerThread

_ids = itertools.count()


def _request(prompt: list[int], fork_of: str | None = None, **params) -> Request:
    r = Request(f"n{next(_ids)}", list(prompt), SamplingParams(**params), max_tokens=4)
    r.fork_of = fork_of
    return r


# ---- scheduler and KV pool, no model --------------------------------------------------------------

@pytest.mark.parametrize("prompt_len", [10, 12])  # a partial last block (copied) and whole blocks only
def test_forks_share_full_blocks_and_copy_the_partial_one(prompt_len):
    kv = PagedKVCache(32, 4)
    sched = DefaultScheduler(kv, watermark=0.0)
    parent = _request(range(prompt_len))
    kids = [_request(range(prompt_len), fork_of=parent.request_id) for _ in range(3)]
    for r in (parent, *kids):
        sched.add(r)
    assert sched.num_waiting == 4 and sched.get(kids[0].request_id) is kids[0]
    plan = sched.schedule()
    assert [c.request for c in plan.chunks] == [parent, *kids]
    assert plan.num_tokens == prompt_len                      # the prompt is computed once
    assert all(c.fork_of is parent and c.num_new_tokens == 0 and c.sample for c in plan.chunks[1:])
    full = prompt_len // 4
    for kid in kids:
        assert kid.block_table[:full] == parent.block_table[:full]
        assert kid.num_computed_tokens == prompt_len and kid.status is Status.RUNNING
    if prompt_len % 4:
        last = parent.block_table[full]
        assert sorted(plan.block_copies) == sorted((last, k.block_table[full]) for k in kids)
        assert len({k.block_table[full] for k in kids} | {last}) == 4  # each writes its own copy
    else:
        assert plan.block_copies == []
    check_pool(kv, [parent, *kids])
    for r in (parent, *kids):
        sched.finish(r)
    check_whole(kv)


def test_forks_not_yet_forked_compute_the_prompt_when_their_parent_goes():
    kv = PagedKVCache(32, 4)
    sched = DefaultScheduler(kv, watermark=0.0, max_num_batched_tokens=4)
    parent = _request(range(10))
    kid = _request(range(10), fork_of=parent.request_id)
    sched.add(parent)
    sched.add(kid)
    sched.schedule()             # a first chunk of the parent's prompt: nothing to fork yet
    sched.finish(parent)          # aborted mid-prefill
    assert sched.get(kid.request_id) is kid and kid in list(sched.waiting)
    plan = sched.schedule()
    assert [(c.request, c.fork_of) for c in plan.chunks] == [(kid, None)]
    sched.finish(kid)
    check_whole(kv)


def test_a_request_expecting_forks_waits_for_them():
    kv = PagedKVCache(32, 4)
    sched = DefaultScheduler(kv, watermark=0.0)
    parent = _request(range(9))
    parent.num_forks = 2
    sched.add(parent)
    assert not sched.schedule() and sched.num_waiting == 1  # held: a fork still to come would miss its prefill
    kids = [_request(range(9), fork_of=parent.request_id) for _ in range(2)]
    sched.add(kids[0])
    assert not sched.schedule()
    sched.add(kids[1])
    plan = sched.schedule()
    assert [c.request for c in plan.chunks] == [parent, *kids] and plan.num_tokens == 9
    for r in (parent, *kids):
        sched.finish(r)
    check_whole(kv)


def test_a_fork_aborted_while_held_leaves_nothing_behind():
    kv = PagedKVCache(32, 4)
    sched = DefaultScheduler(kv, watermark=0.0)
    parent = _request(range(9))
    kid = _request(range(9), fork_of=parent.request_id)
    sched.add(parent)
    sched.add(kid)
    sched.finish(kid)
    assert sched.get(kid.request_id) is None and sched.num_waiting == 1
    plan = sched.schedule()
    assert [c.request for c in plan.chunks] == [parent] and not plan.block_copies
    sched.finish(parent)
    check_whole(kv)


# ---- the kernel: work counted, outputs equal to independent requests ----------------------------------

async def _run_n(kernel: Kernel, ids: list[int], n: int, seed: int, share: bool) -> tuple[list[list[int]], list]:
    """n samples: as the n choices of one in-process request (share), or as n requests seeded seed + i."""
    if share:
        handles = await kernel.submit_choices(prompt_token_ids=ids, n=n, max_tokens=6, temperature=1.0, seed=seed,
                                              ignore_eos=True)
    else:
        handles = [await kernel.submit(prompt_token_ids=ids, max_tokens=6, temperature=1.0, seed=seed + i,
                                       ignore_eos=True) for i in range(n)]
    outs = [None] * n

    async def read(i: int) -> None:
        outs[i] = await handles[i].result()

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(read, i)
    return [c.token_ids for c in outs], [c.usage for c in outs]


@pytest.mark.anyio
async def test_n8_on_a_1000_token_prompt_prefills_it_once(demo_model_dir):
    steps: list[StepDone] = []

    class Count:
        modelcall_plugin_name = "count_steps"

        @hookimpl
        def register_observers(self, register):
            register(StepDone, steps.append)

    ids = [(7 * i) % 1500 + 100 for i in range(1000)]  # 1000 % 16 = 8: the last prompt block is partial
    async with Kernel(dtype="float32", max_model_len=2048, block_size=16, enable_prefix_caching=False,
                      kv_cache_memory_gb=1 / 16,  # 4,096 blocks, not the default 65,536 (~0.4 s to zero)
                      plugins=[Count()]) as k:
        shared, usage = await _run_n(k, ids, 8, seed=11, share=True)
        work = sum(s.num_tokens for s in steps)
        steps.clear()
        alone, _ = await _run_n(k, ids, 8, seed=11, share=False)  # no prefix cache: 8 prefills
        work_alone = sum(s.num_tokens for s in steps)
        assert k.kv.num_free_blocks() == k.kv.num_blocks
    decode = 8 * 5  # each sample's 5 tokens after the first
    assert work == 1000 + decode          # the prompt computed once for all 8 samples
    assert work_alone == 8 * 1000 + decode
    assert shared == alone                # each sample drew exactly what it draws alone (CoW kept its K/V)
    assert len({tuple(s) for s in shared}) > 1
    assert [u.prompt_tokens for u in usage] == [1000] + [0] * 7  # charged once


# ---- HTTP: n and best_of ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(demo_model_dir):
    with ServerThread(dtype="float32", max_model_len=512) as s:
        yield s


def test_http_n_samples_share_the_prompt_and_count_it_once(server):
    prompt = "def fibonacci(n):\n    if n < 2:\n        return n\n"
    body = {"prompt": prompt, "max_tokens": 5, "n": 4, "temperature": 1.0, "seed": 5}
    before = server.stats()["steps"]
    r = requests.post(server.base_url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    n_prompt = len(requests.post(server.base_url + "/tokenize", json={"prompt": prompt}).json()["tokens"])
    assert out["usage"]["prompt_tokens"] == n_prompt and out["usage"]["completion_tokens"] == 20
    assert server.stats()["steps"] - before == 5  # one prefill step for all four, then four decode steps
    chat = requests.post(server.base_url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "n": 3, "temperature": 1.0, "seed": 3})
    assert chat.status_code == 200 and len(chat.json()["choices"]) == 3


def test_http_best_of_returns_the_most_likely_samples(server):
    body = {"prompt": "import os\n", "max_tokens": 4, "temperature": 1.0, "seed": 9, "logprobs": 0}
    many = requests.post(server.base_url + "/v1/completions", json={**body, "n": 4}, timeout=60).json()
    best = requests.post(server.base_url + "/v1/completions", json={**body, "n": 2, "best_of": 4}, timeout=60).json()
    ranked = sorted(many["choices"], key=lambda c: -sum(c["logprobs"]["token_logprobs"]))
    assert [c["text"] for c in best["choices"]] == [c["text"] for c in ranked[:2]]
    assert [c["index"] for c in best["choices"]] == [0, 1]
    assert best["usage"]["completion_tokens"] == 16  # all four samples were generated


def test_quota_and_ledger_charge_the_shared_prompt_once(tmp_path, demo_model_dir):
    from keys_util import write_keys

    from modelcall.plugins.ledger.plugin import ledger_of
    from modelcall.plugins.ledger.store import open_readonly

    prompt = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n" * 2
    keys = write_keys(tmp_path / "keys.toml", {"mc-n-key": {"name": "n", "tpm": 200}})
    db = tmp_path / "ledger.sqlite3"
    with ServerThread(plugin_config={"auth": {"api_keys": str(keys)}, "ledger": {"path": str(db)}}) as s:
        head = {"x-api-key": "mc-n-key"}
        n_prompt = len(requests.post(s.base_url + "/tokenize", json={"prompt": prompt}, headers=head).json()["tokens"])
        assert 4 * (n_prompt + 8) > 200 >= n_prompt + 4 * 8  # fits only when the prompt is charged once
        r = requests.post(s.base_url + "/v1/completions", headers=head, timeout=60,
                          json={"prompt": prompt, "max_tokens": 8, "n": 4, "temperature": 1.0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == n_prompt
        observer, _ = ledger_of(s.kernel)
        observer.flush()
        with open_readonly(db) as conn:
            rows = conn.execute("SELECT COUNT(*), SUM(prompt_tokens), SUM(completion_tokens) FROM requests "
                                "WHERE key_name = 'n' AND status = 200").fetchone()
    assert tuple(rows) == (4, n_prompt, 32)
