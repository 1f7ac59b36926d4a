"""PEFT LoRA adapters for the tests, built by PEFT itself on a tiny checkpoint, and their reference outputs.

An adapter here has random A and B (PEFT's `init_lora_weights=False`), B scaled up so that every adapter's greedy
output differs from the base model's (an adapter that changes nothing would prove nothing). The reference output of
an adapter is transformers' `generate` on PEFT's `merge_and_unload()` model, fp32, greedy.
"""
from __future__ import annotations

import os
from typing import Any, Callable

# name -> LoraConfig fields: ranks 8 and 16, different target sets, plain and rsLoRA scaling, another alpha
ADAPTERS: dict[str, dict[str, Any]] = {
    "qv8": dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
    "all16": dict(r=16, lora_alpha=16, use_rslora=True,
                  target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    "mlp8": dict(r=8, lora_alpha=32, target_modules=["o_proj", "gate_proj", "up_proj", "down_proj"]),
    "kod16": dict(r=16, lora_alpha=8, target_modules=["k_proj", "o_proj", "down_proj"]),
}


def build_adapter(base_dir: str, out_dir: str, seed: int, b_std: float = 0.3, **lora: Any) -> str:
    """Save a PEFT adapter of `base_dir` with random A and B (B ~ N(0, b_std)) to `out_dir`."""
    import peft
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    pm = peft.get_peft_model(model, peft.LoraConfig(init_lora_weights=False, lora_dropout=0.0, **lora))
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, b_std)
    pm.save_pretrained(out_dir)
    return out_dir


def build_adapters(base_dir: str, root: str, specs: dict[str, dict[str, Any]] = ADAPTERS) -> dict[str, str]:
    return {name: build_adapter(base_dir, os.path.join(root, name), seed=i + 1, **spec)
            for i, (name, spec) in enumerate(specs.items())}


def merged_model(base_dir: str, adapter_dir: str | None) -> Any:
    """The base model, or PEFT's merge of the adapter into it, fp32, eval."""
    import peft
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    if adapter_dir is not None:
        model = peft.PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    return model.eval()


def reference_outputs(base_dir: str, adapter_dir: str | None, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    """Greedy new token ids of each prompt through transformers' `generate` on the merged model (EOS ignored)."""
    import torch

    model = merged_model(base_dir, adapter_dir)
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = model.generate(torch.tensor([p]), max_new_tokens=max_new, min_new_tokens=0, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
            out.append(ids[0, len(p):].tolist())
    return out


def break_adapter(monkeypatch: Any, name: str, change: Callable[[Any], None]) -> None:
    """Every read of adapter `name` (plugins/runner/lora_weights.read_adapter, as the registry calls it) passes its
    LoraWeights through `change`: the deliberate breaks the parity tests must catch."""
    from modelcall.plugins.runner import lora_registry

    real = lora_registry.read_adapter

    def broken(adapter: str, *args: Any, **kwargs: Any) -> Any:
        w = real(adapter, *args, **kwargs)
        if adapter == name:
            change(w)
        return w

    monkeypatch.setattr(lora_registry, "read_adapter", broken)
