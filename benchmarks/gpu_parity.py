"""benchmarks/gpu_figures.py's greedy parity: modelcall against transformers' generate on the same device and dtype,
fp32 exactly, bf16 up to a near-tie of the fp32 reference."""
from __future__ import annotations

import os
from typing import Any

from gpu_common import build_model_dir, complete_all, random_prompts

# bf16 greedy parity: where the two greedy sequences first differ, the fp32 reference's logit of
# transformers' token minus that of modelcall's token must be at most this fraction of the reference's
# largest |logit| (a near-tie that bf16 rounding may flip); before that point the tokens are equal.
BF16_TIE_TOLERANCE = 2e-2

def reference_greedy(model: Any, prompt: list[int], n: int, device: Any) -> list[int]:
    import torch
    ids = torch.tensor([prompt], device=device)
    gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return gen[0, len(prompt):].tolist()


async def engine_greedy(model_dir: str, device: str, dtype_name: str, prompts: list[list[int]], n: int) -> list[list[int]]:
    from modelcall.core import Kernel, KernelConfig
    async with Kernel(KernelConfig(model=model_dir, device=device, dtype=dtype_name, kv_cache_memory_gb=0.25)) as kernel:
        done = await complete_all(kernel, prompts, n)
    return [list(d.token_ids) for d in done]


async def parity(sz: dict, device: Any, dtype_name: str, scratch: str) -> dict:
    """Greedy tokens of modelcall vs transformers' generate on the same device and dtype. fp32: exact.
    bf16: equal up to the first difference, and that difference a near-tie of the fp32 reference
    (BF16_TIE_TOLERANCE)."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, dtype_name)
    model_dir, _, _ = build_model_dir(sz["parity_model"], dtype, device, os.path.join(scratch, f"parity-{dtype_name}"))
    prompts = [random_prompts(1, 5 + 7 * i, sz["parity_model"]["vocab_size"], 100 + i)[0]
               for i in range(sz["parity_prompts"])]
    ours = await engine_greedy(model_dir, str(device), dtype_name, prompts, sz["parity_tokens"])
    ref_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    ref_model.generation_config.eos_token_id = None   # like ignore_eos: every sequence has parity_tokens
    theirs = [reference_greedy(ref_model, p, sz["parity_tokens"], device) for p in prompts]
    exact = sum(a == b for a, b in zip(ours, theirs))
    result: dict[str, Any] = {"prompts": len(prompts), "tokens_each": sz["parity_tokens"], "identical": exact}
    if dtype_name == "float32":
        result["pass"] = exact == len(prompts)
        return result
    fp32 = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    gaps = []
    for p, a, b in zip(prompts, ours, theirs):
        i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if i is None:
            continue
        with torch.inference_mode():
            logits = fp32(torch.tensor([p + a[:i]], device=device)).logits[0, -1].float()
        gaps.append(float((logits[b[i]] - logits[a[i]]) / logits.abs().max()))
    result.update(tolerance=BF16_TIE_TOLERANCE, divergences=len(gaps), max_relative_gap=max(gaps, default=0.0),
                  **{"pass": all(g <= BF16_TIE_TOLERANCE for g in gaps)})
    return result
