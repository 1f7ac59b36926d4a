"""The runner with the Triton attention path (runner `attention: triton`, the path chosen on CUDA), run here by
Triton's CPU interpreter: the logits of random ragged mixed steps (prefill chunks over a cached prefix, whole
prompts, decodes, shuffled) match transformers' own forward within 1e-4 of their scale, for Gemma 2 (GQA,
soft-capping, query_pre_attn_scalar, a window that slides) and gpt-oss (sinks, full and sliding KV groups).
Whole fresh prompts with those variants run through the kernel as well (cuda_attention.fresh_group).
Plain causal GQA/MQA/MHA is covered kernel-level in tests/test_triton_attention.py."""
from __future__ import annotations

import pytest
import torch
from family_models import build_family

from modelcall.plugins.runner import cuda_attention

import triton  # noqa: E402,F401  (the test extra: a missing or broken triton is an error, not a skip)

# A CUDA machine runs these kernels compiled (tests/test_gpu.py), not in the interpreter (tests/conftest.py).
pytestmark = pytest.mark.skipif(not cuda_attention.interpreting(),
                                reason="needs TRITON_INTERPRET=1 when triton was first imported")


@pytest.mark.parametrize("name", ["gemma2", "gpt_oss"])
def test_runner_logits_through_the_triton_kernel_match_transformers(name, tmp_path, demo_model_dir, monkeypatch):
    from test_runner import drive_ragged_steps, make_runner
    from transformers import AutoModelForCausalLM

    model_dir = build_family(name, str(tmp_path), demo_model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32).eval()
    runner = make_runner(model_dir, plugin_config={"runner": {"attention": "triton"}})
    assert runner.attention_backend == "triton"
    calls = []
    real = cuda_attention.paged_attention
    monkeypatch.setattr(cuda_attention, "paged_attention", lambda *a, **k: calls.append(a[7]) or real(*a, **k))
    fresh = []
    real_fresh = cuda_attention.fresh_group
    monkeypatch.setattr(cuda_attention, "fresh_group", lambda *a: fresh.append(a[5].q_len) or real_fresh(*a))
    assert drive_ragged_steps(runner, hf, seed=3) < 1e-4, name
    assert 1 in calls and max(calls) > 1, "both the decode and the varlen prefill shapes ran"
    # whole prompts longer than the 8-token window (both families), soft-capped (Gemma 2) or with sinks (gpt-oss)
    # go through the kernel too, not a dense mask
    assert fresh and max(fresh) > 8, fresh
