"""Greedy continuations from transformers, one prompt at a time (fp32, EOS ignored): the reference
the engine's outputs must equal, whatever batching, caching or overlap it used."""
from __future__ import annotations


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
