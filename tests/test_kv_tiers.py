"""The KV tiers (host RAM, then a directory): outputs never change, blocks outlive eviction and restart, and a
block is loaded only into the model, dtype and tenant it was computed for (docs/kv-cache.md)."""
from __future__ import annotations

import os
import random
import shutil
import stat

import anyio
import pytest

from modelcall.core.metering import Caller
from modelcall.events import Preempted
from modelcall.plugins.metrics.plugin import metrics_for
from modelcall.testing import EventCollector
from modelcall.testing.kernels import kernel_for_test

from kv_invariants import check_whole

pytestmark = pytest.mark.anyio

BLOCK = 16
# 6 conversations of a shared 48-token system part and 56 tokens of their own, asked twice: a pool of 14 blocks
# holds barely two of them, so by the second round every prefix has left the pool.
rng = random.Random(42)
SYSTEM = [rng.randrange(10, 500) for _ in range(48)]
PROMPTS = [SYSTEM + [rng.randrange(10, 500) for _ in range(56)] for _ in range(6)]
HOST_GB = 4 * 16384 / 2**30   # 4 blocks of the demo model (2 layers x 2 KV heads x 32 dims x 16 tokens, K and V, fp32)
SMALL_POOL = {"num_kv_blocks": 14, "block_size": BLOCK, "max_num_batched_tokens": 32}   # chunked prefill too


async def _complete(kernel, ids: list[int], caller: Caller | None = None):
    return await kernel.complete(prompt_token_ids=ids, max_tokens=12, temperature=0, ignore_eos=True, caller=caller)


async def _round(kernel, prompts: list[list[int]], *, concurrent: bool = False) -> list:
    """Each prompt once, in order (or all at once: several requests contend for the pool and preempt)."""
    if not concurrent:
        return [await _complete(kernel, p) for p in prompts]
    out: dict[int, object] = {}

    async def one(i: int) -> None:
        out[i] = await _complete(kernel, prompts[i])

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)
    return [out[i] for i in range(len(prompts))]


@pytest.fixture(scope="module")
def references(demo_model_dir) -> list[list[int]]:
    """Greedy outputs with no tier, one request at a time in a pool that holds everything."""
    async def run() -> list[list[int]]:
        async with kernel_for_test(model=demo_model_dir, block_size=BLOCK, num_kv_blocks=256) as kernel:
            return [(await _complete(kernel, p)).token_ids for p in PROMPTS]
    return anyio.run(run)


def _block_files(directory) -> list[str]:
    return sorted(os.path.join(r, f) for r, _, fs in os.walk(directory) for f in fs if f.endswith(".kv"))


async def test_outputs_are_the_same_with_the_tiers_after_eviction_chunked_prefill_and_preemption(
        demo_model_dir, references, tmp_path):
    events = EventCollector()
    async with kernel_for_test([events], model=demo_model_dir, kv_cache_dir=str(tmp_path), kv_cache_host_gb=HOST_GB,
                               **SMALL_POOL) as kernel:
        assert kernel.kv.tiers.host.capacity_blocks == 4   # so evicted blocks come back from both tiers
        first = await _round(kernel, PROMPTS, concurrent=True)
        assert events.of(Preempted), "the pool was meant to force preemption"
        second = await _round(kernel, PROMPTS)
        third = await _round(kernel, PROMPTS, concurrent=True)
        check_whole(kernel.kv)
        stats = kernel.kv.stats()
    assert [d.token_ids for d in first] == references
    assert [d.token_ids for d in second] == references
    assert [d.token_ids for d in third] == references
    # the second round found every prefix beyond the pool: 96 of each 104-token prompt (6 blocks) cached
    assert [d.finished.usage.cached_tokens for d in second] == [96] * 6
    assert sum(d.finished.usage.cached_disk_tokens for d in second) > 0
    assert stats["host_hit_blocks"] > 0 and stats["disk_hit_blocks"] > 0, stats
    assert stats["disk_write_dropped"] == 0 and stats["disk_rejected"] == 0


async def test_a_restart_on_the_same_directory_serves_known_prefixes_from_disk(demo_model_dir, references, tmp_path):
    async with kernel_for_test(model=demo_model_dir, kv_cache_dir=str(tmp_path), **SMALL_POOL) as kernel:
        await _round(kernel, PROMPTS[:3])
    files = _block_files(tmp_path)
    assert files and all(stat.S_IMODE(os.stat(f).st_mode) == 0o600 for f in files)
    async with kernel_for_test(model=demo_model_dir, kv_cache_dir=str(tmp_path), **SMALL_POOL) as kernel:
        again = await _round(kernel, PROMPTS[:4])
        text, model = metrics_for(kernel).exposition().decode(), kernel.model_name
    assert [d.token_ids for d in again] == references[:4]
    usage = [d.finished.usage for d in again]
    # the first comes back from disk whole; the next two find the shared system part in the pool again and their
    # own part on disk; the fourth was never served before: only the system part, from the pool
    assert [(u.cached_tokens, u.cached_disk_tokens) for u in usage] == [(96, 96), (96, 48), (96, 48), (48, 0)]
    assert f'modelcall:cached_prompt_tokens_disk_total{{model_name="{model}"}} 192.0' in text
    assert "modelcall:kv_tier_disk_bytes" in text


async def test_a_stale_block_of_another_model_is_never_loaded(demo_model_dir, tmp_path):
    """Two models alike in config and file sizes (the model identity cannot tell them apart) get different
    fingerprints: the second starts cold on the first one's directory, and block files planted in its own
    folder are skipped and reported."""
    import torch
    from safetensors.torch import load_file, save_file

    other = tmp_path / "other-model"
    shutil.copytree(demo_model_dir, other)
    weights = load_file(other / "model.safetensors")
    torch.manual_seed(1)
    save_file({k: v + 0.05 * torch.randn_like(v) for k, v in weights.items()}, other / "model.safetensors",
              metadata={"format": "pt"})
    cache = tmp_path / "kv"
    async with kernel_for_test(model=demo_model_dir, kv_cache_dir=str(cache), **SMALL_POOL) as kernel:
        identity = kernel.spec.identity
        await _round(kernel, PROMPTS[:2])
    async with kernel_for_test(model=str(other), block_size=BLOCK, num_kv_blocks=256) as kernel:
        assert kernel.spec.identity == identity, "the test needs models the identity cannot tell apart"
        own = [d.token_ids for d in await _round(kernel, PROMPTS[:2])]
    async with kernel_for_test(model=str(other), kv_cache_dir=str(cache), **SMALL_POOL) as kernel:
        served = await _round(kernel, PROMPTS[:2])
        disk = kernel.kv.tiers.disk
        assert disk.other_fingerprints, "the first model's folder is seen and left alone"
    assert [d.token_ids for d in served] == own
    assert [d.finished.usage.cached_tokens for d in served] == [0, 48]   # only its own system part, from its pool
    # the first model's files planted in the second's folder: refused at start, none loaded
    first_files = [f for f in _block_files(cache) if os.path.basename(os.path.dirname(f)) in disk.other_fingerprints]
    for f in first_files:
        shutil.copy(f, os.path.join(disk.dir, os.path.basename(f)))
    async with kernel_for_test(model=str(other), kv_cache_dir=str(cache), **SMALL_POOL) as kernel:
        replanted = await _round(kernel, PROMPTS[:2])
        disk = kernel.kv.tiers.disk
        text = metrics_for(kernel).exposition().decode()
    assert [d.token_ids for d in replanted] == own
    assert all(d.finished.usage.cached_disk_tokens == 0 for d in replanted)
    skipped = dict(disk.skipped)
    assert len(skipped) >= len(first_files) and all("another model fingerprint" in why for why in skipped.values())
    assert f"modelcall:kv_tier_disk_skipped_files{{model_name=\"{kernel.model_name}\"}} {len(skipped)}.0" in text


async def test_two_keys_with_the_same_prompt_share_no_disk_block(demo_model_dir, tmp_path):
    alice, bob = Caller(name="alice"), Caller(name="bob")
    async with kernel_for_test(model=demo_model_dir, kv_cache_dir=str(tmp_path), **SMALL_POOL) as kernel:
        await _complete(kernel, PROMPTS[0], alice)
    async with kernel_for_test(model=demo_model_dir, kv_cache_dir=str(tmp_path), **SMALL_POOL) as kernel:
        for_bob = await _complete(kernel, PROMPTS[0], bob)
        for_alice = await _complete(kernel, PROMPTS[0], alice)
    assert (for_bob.finished.usage.cached_tokens, for_bob.finished.usage.cached_disk_tokens) == (0, 0)
    assert (for_alice.finished.usage.cached_tokens, for_alice.finished.usage.cached_disk_tokens) == (96, 96)
    assert for_bob.token_ids == for_alice.token_ids
