"""Greedy continuations from transformers, one prompt at a time (fp32, EOS ignored): the reference
the engine's outputs must equal, whatever batching, caching or overlap it used."""
from __future__ import annotations

import random


def prompts_with_a_shared_prefix(seed: int, prefix: int, shortest_own: int) -> list[list[int]]:
    """Three prompts of a common `prefix`-token start plus 1-19 own tokens, then three of their own (shortest_own
    to 59 tokens): ids from 10 to 2047, the same for the same seed."""
    rng = random.Random(seed)
    start = [rng.randrange(10, 2048) for _ in range(prefix)]
    return ([start + [rng.randrange(10, 2048) for _ in range(rng.randrange(1, 20))] for _ in range(3)]
            + [[rng.randrange(10, 2048) for _ in range(rng.randrange(shortest_own, 60))] for _ in range(3)])


def greedy_continuations(model_dir: str, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # like ignore_eos: always max_new_tokens tokens
    out = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
        out.append(gen[0, len(prompt):].tolist())
    return out
