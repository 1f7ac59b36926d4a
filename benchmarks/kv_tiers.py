"""KV tiers (issue 42): multi-turn conversations on a pool too small for them, with and without the disk tier,
then a restart on the same directory against a cold start. Ratios of one run; sizes scaled by --scale.

    conversations x turns, a shared system prompt, a history of its own per conversation, a pool that holds
    `pool_conversations` of them at their longest; each turn adds a 32-token user message and 16 output tokens.

Issue sizes (--scale 1): 32 conversations x 4 turns, 1,536-token system prompt, 512-token histories, a pool
holding 8 conversations. `--scale 4` divides the token counts and the conversation count by 4 (turns stay).

    taskset -c 0 .venv/bin/python benchmarks/kv_tiers.py --model smollm2 --threads 1 --scale 4
"""
from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import tempfile
import time

from modelcall.core import Kernel

USER, OUTPUT = 32, 16


def conversations(n: int, system: int, history: int, seed: int = 0) -> tuple[list[int], list[list[int]]]:
    rng = random.Random(seed)
    return [rng.randrange(100, 20000) for _ in range(system)], \
        [[rng.randrange(100, 20000) for _ in range(history)] for _ in range(n)]


async def ttft(kernel: Kernel, ids: list[int]) -> tuple[float, list[int], int, int]:
    done = await kernel.complete(prompt_token_ids=ids, max_tokens=OUTPUT, temperature=0, ignore_eos=True)
    u = done.finished.usage
    return done.finished.timings.ttft_s, done.token_ids, u.cached_tokens, u.cached_disk_tokens


async def serve_turns(cfg: dict, system: list[int], histories: list[list[int]], turns: int) -> dict:
    """Every conversation's turn 1, then every turn 2, ...: by a conversation's next turn the pool has served
    the others, so its own blocks have left the pool."""
    rng = random.Random(1)
    contexts = [system + h for h in histories]
    later: list[float] = []
    outputs: list[list[int]] = []
    async with Kernel(**cfg) as kernel:
        await ttft(kernel, [7] * 8)   # first-call costs out of the figures
        for turn in range(turns):
            for c, ctx in enumerate(contexts):
                ctx.extend(rng.randrange(100, 20000) for _ in range(USER))
                t, out, _, _ = await ttft(kernel, ctx)
                ctx.extend(out)
                outputs.append(out)
                if turn:
                    later.append(t)
        stats = kernel.kv.stats()
    return {"later_ttft_p50": statistics.median(later), "outputs": outputs, "stats": stats, "contexts": contexts}


async def first_request(cfg: dict, ids: list[int]) -> tuple[float, list[int], int, int]:
    async with Kernel(**cfg) as kernel:
        await ttft(kernel, [7] * 8)
        return await ttft(kernel, ids)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--scale", type=int, default=4, help="divide the issue's token and conversation counts by this")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--dir", help="the disk tier's directory (default: a temporary one, removed after)")
    a = ap.parse_args()
    n, system, history = 32 // a.scale, 1536 // a.scale, 512 // a.scale
    block = 16
    longest = system + history + a.turns * (USER + OUTPUT)
    num_blocks = (8 // a.scale or 1) * -(-longest // block) + 1   # the pool holds 8 conversations (scaled) at their longest
    system_ids, histories = conversations(n, system, history)
    base = dict(model=a.model, threads=a.threads, block_size=block, num_kv_blocks=num_blocks,
                max_num_batched_tokens=2048)
    directory = a.dir or tempfile.mkdtemp(prefix="kv-tiers-")
    print(f"{n} conversations x {a.turns} turns, system {system}, histories {history} tokens, pool {num_blocks} "
          f"blocks of {block} ({8 // a.scale or 1} conversations at their longest, {longest} tokens)")
    try:
        off = await serve_turns(base, system_ids, [list(h) for h in histories], a.turns)
        t0 = time.perf_counter()
        on = await serve_turns({**base, "kv_cache_dir": directory}, system_ids, [list(h) for h in histories], a.turns)
        wall_on = time.perf_counter() - t0
        assert on["outputs"] == off["outputs"], "greedy outputs differ with the disk tier"
        s = on["stats"]
        # restart: the tiered kernel above was stopped as SIGTERM stops `modelcall serve` (shutdown flushes the writer)
        known = on["contexts"][0] + [11] * USER   # conversation 0 once more: its whole history is known
        cold_t, cold_out, _, _ = await first_request({**base, "kv_cache_dir": tempfile.mkdtemp(prefix="kv-cold-")}, known)
        warm_t, warm_out, cached, disk = await first_request({**base, "kv_cache_dir": directory}, known)
        assert warm_out == cold_out, "greedy output differs after the restart"
        print(f"turns 2..{a.turns} TTFT p50: without the tier {off['later_ttft_p50'] * 1e3:.0f} ms, with it "
              f"{on['later_ttft_p50'] * 1e3:.0f} ms: ratio {on['later_ttft_p50'] / off['later_ttft_p50']:.3f} (bar 0.3)")
        print(f"after a restart, first request on a known {len(known)}-token prefix: {warm_t * 1e3:.0f} ms "
              f"({cached} cached, {disk} from disk) vs a cold start {cold_t * 1e3:.0f} ms: ratio "
              f"{warm_t / cold_t:.3f} (bar 0.25)")
        print(f"disk: {s['disk_bytes'] / 2**30:.3f} GiB in {s['disk_blocks']:.0f} blocks; written "
              f"{s['disk_bytes_written'] / 2**20:.0f} MiB in {s['disk_write_s']:.2f} s of the writer thread "
              f"({s['disk_bytes_written'] / 2**20 / max(s['disk_write_s'], 1e-9):.0f} MiB/s), "
              f"{s['disk_write_dropped']:.0f} dropped; tiered run {wall_on:.1f} s wall, of which the engine loop "
              f"copied blocks out for {s['tier_copy_s'] * 1e3:.0f} ms and back for {s['tier_restore_s'] * 1e3:.0f} ms")
    finally:
        if not a.dir:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
