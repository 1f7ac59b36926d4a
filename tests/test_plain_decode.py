"""The lean stack's plain decode steps (plugins/runner/plain_decode.py): each layer's rope, K/V write and attention in
one C call give the same logits, bit for bit, as the per-call path (attention.paged_attention), with sliding windows
and several KV groups too, and steps it does not cover (fresh prompts) keep that path."""
from __future__ import annotations

import pytest
import torch

from test_lean import family_dirs, lockstep_logits, one_thread_after  # noqa: F401 (fixtures)
from test_runner import make_runner

from modelcall.plugins.runner import attention, cpu_kernel, fused_ops, lean, packing, plain_decode

pytestmark = pytest.mark.skipif(fused_ops.load() is None or cpu_kernel.load() is None, reason="no C compiler here")


def counting(monkeypatch) -> dict[str, int]:
    """Counts of plain-path layer calls and of per-call attention.paged_attention calls."""
    calls = {"plain": 0, "per_call": 0}
    attend, paged = plain_decode.DecodeAttention.attend, attention.paged_attention

    def plain(self, *a):
        calls["plain"] += 1
        return attend(self, *a)

    def per_call(*a, **k):
        calls["per_call"] += 1
        return paged(*a, **k)
    monkeypatch.setattr(plain_decode.DecodeAttention, "attend", plain)
    monkeypatch.setattr(lean.attention, "paged_attention", per_call)
    return calls


@pytest.mark.parametrize("name,dtype,threads,kv", [("llama3", "float32", 1, "auto"), ("qwen3", "bfloat16", 2, "auto"),
                                                   ("demo", "bfloat16", 1, "fp8"), ("qwen2", "float32", 2, "auto"),
                                                   ("mistral_window", "bfloat16", 1, "auto"),
                                                   ("gemma3", "float32", 1, "auto")])
def test_plain_decode_steps_give_the_per_call_paths_logits(name, dtype, threads, kv, family_dirs, monkeypatch):
    """Random mixed steps (whole prompts, short chunks over cached K/V, decodes): the steps without a fresh prompt
    take the one-call path, the others the per-call path, and every step's logits equal a runner's that never takes
    the one-call path (fp32 with packed linears as for a large model; bf16; an fp8 cache; Qwen3's head norms; an
    8-token sliding window; Gemma 3's sliding and full layers in two KV groups with their two rotary tables)."""
    monkeypatch.setattr(packing, "FP32_MIN_WEIGHTS", 0)   # fp32: pack the small test models as a large one
    model_dir = family_dirs[name]
    forced = {"lean": True} if name == "gemma3" else {}   # Gemma's stack is taken for quantized weights by default
    one_call = make_runner(model_dir, dtype=dtype, threads=threads, kv_cache_dtype=kv,
                           plugin_config={"runner": forced})
    per_call = make_runner(model_dir, dtype=dtype, threads=threads, kv_cache_dtype=kv,
                           plugin_config={"runner": {**forced, "lean_plain_decode": False}})
    assert one_call.lean is not None and one_call.lean.plain is not None
    assert per_call.lean is not None and per_call.lean.plain is None
    assert (len(one_call.groups) > 1) == (name == "gemma3")
    calls = counting(monkeypatch)
    got = lockstep_logits([one_call], seed=3)
    layers = len(one_call.lean.layers)
    assert calls["plain"] >= 3 * layers and calls["per_call"] >= layers, calls   # both kinds of step ran
    assert calls["plain"] % layers == 0 and calls["per_call"] % layers == 0   # a whole step takes one path
    want = lockstep_logits([per_call], seed=3)
    for step, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a[0], b[0]), f"step {step}: {(a[0] - b[0]).abs().max().item()}"
