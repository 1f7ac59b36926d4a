"""Prefix caching pays off where users feel it: a request whose 1,024-token prefix is cached computes only
its new tokens, and reaches its first token in at most a fifth of the time the same request takes cold."""
from __future__ import annotations

import random
import shutil

import anyio
import pytest

from modelcall.core import Kernel
from modelcall.events import StepDone
from modelcall.testing import EventCollector

pytestmark = pytest.mark.anyio

PREFIX = 1024


@pytest.fixture(scope="module")
def bigger_model(demo_model_dir, tmp_path_factory) -> str:
    """The demo tokenizer on a model large enough that a 1,024-token prefill clearly costs something."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("ttft-model")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=4096,
                         eos_token_id=2, pad_token_id=0, tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        src = f"{demo_model_dir}/{name}"
        try:
            shutil.copy(src, out / name)
        except FileNotFoundError:
            pass
    return str(out)


async def _first_token(kernel: Kernel, events: EventCollector, ids: list[int]) -> tuple[float, int, int]:
    """(time to first token, prompt tokens read from the cache, tokens the model computed) of one request."""
    events.events.clear()
    done = await kernel.complete(prompt_token_ids=ids, max_tokens=1, temperature=0, ignore_eos=True)
    computed = sum(e.num_tokens for e in events.of(StepDone))   # alone in the kernel: every step was its own
    return done.finished.timings.ttft_s, done.finished.usage.cached_tokens, computed


async def test_cached_1024_token_prefix_is_not_computed_again_and_cuts_time_to_first_token_fivefold(bigger_model):
    rng = random.Random(7)
    prompts = [[rng.randrange(10, 2048) for _ in range(PREFIX)] for _ in range(3)]
    events = EventCollector()
    async with Kernel(model=bigger_model, dtype="float32", threads=1, num_kv_blocks=512, block_size=16,
                      max_num_batched_tokens=2048, plugins=[events]) as kernel:
        await anyio.sleep(0)
        await _first_token(kernel, events, [rng.randrange(10, 2048) for _ in range(64)])   # warm-up: first-call costs
        cold, warm = [], []
        for prefix in prompts:   # NOTE: cold and cached alternate, so a busy spell of the machine hits both
            t, cached, computed = await _first_token(kernel, events, prefix + [rng.randrange(10, 2048) for _ in range(8)])
            assert (cached, computed) == (0, PREFIX + 8)
            cold.append(t)
            t, cached, computed = await _first_token(kernel, events, prefix + [rng.randrange(10, 2048) for _ in range(8)])
            assert (cached, computed) == (PREFIX, 8)   # the work: 8 tokens instead of 1,032
            warm.append(t)
    print(f"TTFT cold {min(cold) * 1e3:.1f} ms, with the prefix cached {min(warm) * 1e3:.1f} ms")
    # NOTE: the time, where users feel it, as a ratio of the best of three within this test: the work ratio is
    # 129x, so a fifth leaves a wide margin for a loaded machine.
    assert min(warm) <= 0.2 * min(cold), f"cold {cold}, cached {warm}"
