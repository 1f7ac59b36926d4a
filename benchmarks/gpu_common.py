"""What benchmarks/gpu_figures.py's figures share: a random Llama saved with a one-word-per-id tokenizer, seeded id
prompts, all of them through one kernel at once, the device's copy bandwidth, the K/V bytes of a token, and an
observer of every StepDone."""
from __future__ import annotations

import random
import statistics
import time
from typing import Any

from modelcall.core import hookimpl
from modelcall.events import StepDone


def sync(device: Any) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_model_dir(shape: dict, dtype: Any, device: Any, into: str, seed: int = 0) -> tuple[str, int, int]:
    """A random Llama built on `device`, saved to `into`; (dir, parameters, bytes of weights)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0, **shape)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype)
    params = sum(p.numel() for p in model.parameters())       # tied weights counted once
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    model.save_pretrained(into)
    save_word_tokenizer(into, shape["vocab_size"])
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return into, params, weight_bytes


def save_word_tokenizer(into: str, vocab: int) -> None:
    """One word per id ("t17"): the engine loads a tokenizer with every model; these prompts are ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", pad_token="t0", bos_token="t1",
                            eos_token="t2").save_pretrained(into)


def measure_bandwidth(device: Any, nbytes: int) -> dict:
    """A device-to-device copy, counting bytes read plus bytes written (median of 20 after 3 warm-ups)."""
    import torch

    src = torch.randn(nbytes // 4, device=device)      # random, never zeros (METHOD.md)
    dst = torch.empty_like(src)
    times = []
    for i in range(23):
        sync(device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            t = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            t = time.perf_counter() - t0
        if i >= 3:
            times.append(t)
    assert torch.equal(dst, src)
    t = statistics.median(times)
    return {"bytes_moved": 2 * src.numel() * 4, "median_s": t, "bytes_per_s": 2 * src.numel() * 4 / t}


class StepLog:
    """Observer plugin: every StepDone of the kernel it is handed to."""

    modelcall_plugin_name = "gpu-figures-steps"

    def __init__(self) -> None:
        self.steps: list[Any] = []

    @hookimpl
    def register_observers(self, register: Any) -> None:
        register(StepDone, self.steps.append, name=self.modelcall_plugin_name)


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(length)] for _ in range(n)]


async def complete_all(kernel: Any, prompts: list[list[int]], max_tokens: int) -> list[Any]:
    import anyio

    results: list[Any] = [None] * len(prompts)

    async def one(i: int) -> None:
        results[i] = await kernel.complete(prompt_token_ids=prompts[i], max_tokens=max_tokens, temperature=0,
                                           ignore_eos=True)

    async with anyio.create_task_group() as tg:
        for i in range(len(prompts)):
            tg.start_soon(one, i)
    return results


def kv_bytes_per_token(shape: dict, kv_elem: int) -> int:
    head_dim = shape["hidden_size"] // shape["num_attention_heads"]
    return shape["num_hidden_layers"] * 2 * shape["num_key_value_heads"] * head_dim * kv_elem
