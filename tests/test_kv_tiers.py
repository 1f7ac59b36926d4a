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
    assert [d.token_ids for d in served] == own
    assert [d.finished.usage.cached_tokens for d in served] == [0, 48]   # only its own system part, from its pool
    assert disk.other_fingerprints, "the first model's folder is seen and left alone"
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


async def test_a_hybrid_sliding_window_family_gets_the_same_outputs_after_a_restart(demo_model_dir, tmp_path):
    """Gemma 3's layers: full attention and sliding windows in separate KV groups; every group's blocks are
    stored (a window's K/V is a function of the prefix too) and read back where the next query reads them."""
    from family_models import build_family

    model = build_family("gemma3", str(tmp_path / "gemma3"), demo_model_dir)
    async with kernel_for_test(model=model, block_size=BLOCK, num_kv_blocks=256) as kernel:
        assert len(set(kernel.spec.layer_windows)) == 2, "the test needs full and sliding layers"
        want = [d.token_ids for d in await _round(kernel, PROMPTS[:3])]
    pool = {**SMALL_POOL, "num_kv_blocks": 40}   # several KV groups share the pool
    async with kernel_for_test(model=model, kv_cache_dir=str(tmp_path / "kv"), **pool) as kernel:
        assert [d.token_ids for d in await _round(kernel, PROMPTS[:3])] == want
    async with kernel_for_test(model=model, kv_cache_dir=str(tmp_path / "kv"), **pool) as kernel:
        again = await _round(kernel, PROMPTS[:3])
        check_whole(kernel.kv)
    assert [d.token_ids for d in again] == want
    assert again[0].finished.usage.cached_tokens == 96 and again[0].finished.usage.cached_disk_tokens == 96


CHILD = """
import asyncio, random, sys
from modelcall.core import Kernel
async def main():
    async with Kernel(model=sys.argv[1], dtype="float32", threads=1, block_size=16, num_kv_blocks=14,
                      kv_cache_dir=sys.argv[2], kv_cache_fsync="always") as kernel:
        await kernel.complete(prompt_token_ids=[int(t) for t in sys.argv[3].split(",")], max_tokens=12,
                              temperature=0, ignore_eos=True)
        kernel.kv.tiers.disk.flush()
        print("written", flush=True)
        rng = random.Random(0)
        while True:   # blocks keep coming until the parent kills this process in the middle of writing one
            await kernel.complete(prompt_token_ids=[rng.randrange(10, 500) for _ in range(160)], max_tokens=1)
asyncio.run(main())
"""


def _kill_mid_write(model: str, directory: str, prompt: list[int], tries: int = 3) -> None:
    """Run a server process that writes blocks (fsync each: a write takes a while) and SIGKILL it the moment an
    unfinished block file is seen; a try where the write finished between the look and the kill is run again."""
    import signal
    import subprocess
    import sys
    import time

    for _ in range(tries):
        child = subprocess.Popen([sys.executable, "-c", CHILD, model, directory, ",".join(map(str, prompt))],
                                 env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True)
        deadline = time.monotonic() + 60
        try:
            assert child.stdout.readline().strip() == "written", "the server process did not start"
            while time.monotonic() < deadline and child.poll() is None:
                if any(e.name.endswith(".kv.tmp") for d in os.scandir(directory) if d.is_dir()
                       for e in os.scandir(d.path)):
                    child.send_signal(signal.SIGKILL)
                    break
                time.sleep(0.0002)
        finally:
            child.kill()
            child.wait()
        if any(f.endswith(".kv.tmp") for _, _, fs in os.walk(directory) for f in fs):
            return
    pytest.fail(f"no write was caught in flight in {tries} tries")


@pytest.mark.slow   # a server process of its own (imports, start-up): ~15 s here
async def test_kill_9_mid_write_then_restart_serves_correctly_and_reports_what_it_skipped(
        demo_model_dir, references, tmp_path):
    from modelcall.core.prefix_keys import block_key, root_key

    _kill_mid_write(demo_model_dir, str(tmp_path), PROMPTS[0])
    unfinished = [f for _, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".kv.tmp")]
    async with kernel_for_test(model=demo_model_dir, kv_cache_dir=str(tmp_path), **SMALL_POOL) as kernel:
        disk = kernel.kv.tiers.disk
        # a torn payload in a file that looks whole (what a power loss can leave): refused when read, not loaded
        keys = [root_key(kernel.spec.identity)]
        for i in range(4):
            keys.append(block_key(keys[-1], PROMPTS[0][i * BLOCK:(i + 1) * BLOCK]))
        torn = os.path.join(disk.dir, keys[4].hex() + ".kv")
        with open(torn, "r+b") as f:
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
            f.seek(-1, os.SEEK_END)
            f.write(bytes([last[0] ^ 0xFF]))
        done = await _complete(kernel, PROMPTS[0])
        skipped = dict(disk.skipped)
        rejected = disk.num_rejected
    assert done.token_ids == references[0]
    # blocks 0-2 from disk; block 3's checksum fails, so the hit ends there and the rest is computed
    assert (done.finished.usage.cached_tokens, done.finished.usage.cached_disk_tokens) == (48, 48)
    assert rejected == 1   # (the file is there again: block 3 was computed, and written through anew)
    assert set(unfinished) <= set(skipped) and all("unfinished write" in skipped[f] for f in unfinished)
    assert not [f for _, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".tmp")]


def test_the_disk_tier_stays_within_its_bound_least_recently_used_out_first(tmp_path):
    import numpy as np

    from modelcall.plugins.kv_cache.disk_tier import DiskTier

    size = 1024
    tier = DiskTier(str(tmp_path), b"f" * 32, {}, size, capacity_bytes=3 * (size + 52 + 4), queue_blocks=64)
    blocks = {bytes([i]) * 4: np.full(size, i, dtype=np.uint8) for i in range(5)}
    for key in list(blocks)[:3]:
        tier.put(key, blocks[key])
    assert tier.flush()
    assert tier.get(bytes([0]) * 4)[0] == 0            # block 0 used: block 1 is now the least recently used
    for key in list(blocks)[3:]:
        tier.put(key, blocks[key])
    tier.close()
    assert sorted(tier.index) == sorted([bytes([0]) * 4, bytes([3]) * 4, bytes([4]) * 4])
    assert tier.num_evicted == 2 and tier.bytes_used <= tier.capacity_bytes
    assert len([f for f in os.listdir(tier.dir) if f.endswith(".kv")]) == 3
    reopened = DiskTier(str(tmp_path), b"f" * 32, {}, size, capacity_bytes=3 * (size + 52 + 4))
    assert sorted(reopened.index) == sorted(tier.index) and not reopened.skipped
    assert (reopened.get(bytes([4]) * 4) == 4).all()
    reopened.close()


def test_a_full_write_queue_drops_blocks_and_counts_them_never_waits(tmp_path):
    import time

    import numpy as np

    from modelcall.plugins.kv_cache.disk_tier import DiskTier

    tier = DiskTier(str(tmp_path), b"f" * 32, {}, 1 << 20, capacity_bytes=1 << 30, fsync="always", queue_blocks=1)
    payload = np.zeros(1 << 20, dtype=np.uint8)
    t0 = time.perf_counter()
    for i in range(50):
        tier.put(i.to_bytes(4, "little"), payload)
    offered_s = time.perf_counter() - t0
    tier.close()
    assert tier.num_dropped > 0 and tier.num_written + tier.num_dropped == 50
    assert offered_s < tier.write_s, "offering blocks must take less than writing them"
