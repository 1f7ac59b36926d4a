"""KV bytes one request holds at 4k context, for a Gemma-3-like and a Mistral-like model, through the real
runner (its KV block bytes) and the real KV policy (what it keeps and releases).

    .venv/bin/python benchmarks/window_kv_bytes.py [--context 4096] [--block-size 16]

The models have the families' real KV layout (layers, window pattern, KV heads, head_dim) and a tiny
hidden size: KV bytes do not depend on it. "before" is a table holding every block of every layer (what
the runner did before window layers released anything); "now" is what the policy holds once the request
has reached `--context` tokens (prompt prefilled in 2048-token chunks, then decodes); the peak is the
most it held on the way (a chunk's own keys are all held while it is computed).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def layouts(t):
    gemma3 = t.Gemma3TextConfig(   # Gemma 3 4B: 34 layers, 5 local : 1 global, window 1024, 4 KV heads of 256
        vocab_size=2048, hidden_size=64, intermediate_size=64, num_hidden_layers=34, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, sliding_window=1024, max_position_embeddings=131072,
        query_pre_attn_scalar=256)
    mistral = t.MistralConfig(     # Mistral 7B v0.1's layout with a 1024 window (its own is 4096)
        vocab_size=2048, hidden_size=64, intermediate_size=64, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, sliding_window=1024, max_position_embeddings=32768)
    return {"gemma3-4b-like": gemma3, "mistral-7b-like (window 1024)": mistral}


def main() -> None:
    import transformers

    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from modelcall.core import KernelConfig, Request, SamplingParams
    from modelcall.plugins.kv_cache import plugin as kv_plugin
    from modelcall.plugins.runner.runner import TorchModelRunner
    from modelcall.plugins.sampler.sampler import TorchSampler

    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--block-size", type=int, default=16)
    args = ap.parse_args()
    bs, ctx = args.block_size, args.context
    torch.set_num_threads(1)
    for name, cfg in layouts(transformers).items():
        with tempfile.TemporaryDirectory() as d:
            transformers.AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).save_pretrained(d)
            config = KernelConfig(model=d, dtype="bfloat16", kv_cache_dtype="bfloat16", threads=1)
            runner = TorchModelRunner(config, d, TorchSampler())
        block_bytes = runner.kv_block_bytes(bs)
        kv = kv_plugin.provide_kv_cache(config, runner.spec, 16 * (ctx // bs + 8))
        req = Request("r", [5] * (ctx - 64), SamplingParams(), max_tokens=64)
        peak = 0
        while req.num_computed_tokens < ctx:   # prefill in 2048-token chunks, then decode to ctx
            n = min(config.max_num_batched_tokens, req.num_tokens - req.num_computed_tokens) or 1
            assert kv.allocate(req, n)
            peak = max(peak, kv.blocks_held(req) if hasattr(kv, "blocks_held") else len(req.block_table))
            req.num_computed_tokens += n
            kv.commit(req)
            if req.num_computed_tokens == req.num_tokens:
                req.all_token_ids.append(5)
        held = kv.blocks_held(req) if hasattr(kv, "blocks_held") else len(req.block_table)
        # every layer's K/V for every position: what one table over all layers held before
        before = 2 * runner.spec.num_layers * ctx * runner.spec.num_kv_heads * runner.spec.head_dim * 2
        now = held * block_bytes
        windows = sorted(set(runner.spec.layer_windows))
        print(f"{name}: layers {runner.spec.num_layers}, windows {windows}, {ctx} tokens, bf16 KV, block {bs}: "
              f"before {before / 2**20:.1f} MiB, now {now / 2**20:.1f} MiB ({now / before:.2f}x; {held} blocks "
              f"of {block_bytes / 2**10:.0f} KiB; peak during the 2048-token prefill chunks "
              f"{peak * block_bytes / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
