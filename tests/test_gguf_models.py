"""The two real GGUF files users have (SmolLM2-135M-Instruct Q4_1, Gemma 3 270M Q4_K_M, fetched from their registry
packages into the user cache) served with their weights quantized, against transformers loading the same file
(`gguf_file=`, dequantized to fp32) as the reference: next-token logits over a 1,024-token text and greedy
continuations. How users run the same files (the openai SDK, `modelcall serve`, resident memory) is in
test_gguf_serving.py: a file of its own, so the slow tier's two workers take one each."""
from __future__ import annotations

import inspect
import os

import pytest
import torch

from modelcall.core import Kernel
from modelcall.plugins.registry_models import fetch
from modelcall.plugins.runner import gguf_file, quant
from plain_gguf_reader import transformers_reads_gguf_plainly

# NOTE: the slow tier: each real model loads twice (transformers fp32 as the reference, modelcall quantized), and
# describing Gemma's 262k-token vocabulary took transformers' GGUF reader most of its set-up (from_pretrained: 31 s CPU
# with gguf's GGUFReader, 14 s with tests/plain_gguf_reader.py's)
pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(1200)]

MODELS = ("smollm2", "gemma3-270m")
KV_GB = 1 / 8
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colors are", "import numpy as np\n\narr =", "Water boils at",
           "The theory of relativity was developed by", "1, 2, 3, 5, 8, 13,"]
NEW_TOKENS = 64
# prefill chunk of the logits test (128 tokens: 8 chunks): none longer than quant.dense_from_tokens(fp32), so every
# matmul runs on the quantized bytes as decode does (a longer chunk dequantizes the weight for torch's GEMM)
QUANT_CHUNK = quant.dense_from_tokens(torch.float32)


def _long_text() -> str:
    """Plain English prose from the standard library's own module docs (fixed for a Python version)."""
    import argparse, calendar, collections, difflib, email, json as js, logging, shlex, textwrap, unittest
    return "\n\n".join(inspect.getdoc(m) or "" for m in (argparse, logging, unittest, difflib, email, textwrap,
                                                           collections, shlex, calendar, js))


@pytest.fixture(scope="module", params=MODELS)
def real(request):
    """(name, GGUF path, transformers reference model, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = fetch.ensure(request.param, quiet=True)
    d, f = os.path.dirname(path), os.path.basename(path)
    with transformers_reads_gguf_plainly():   # the same weights, Gemma's vocabulary parsed in half the time
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    # NOTE: the tokenizer transformers made from this file, as saved in the file's description (gguf_file.py): the
    # same ids for the long text and the prompts as AutoTokenizer.from_pretrained(d, gguf_file=f) (checked on both
    # files), without converting Gemma's 262k-token vocabulary again (15-40 s a run)
    tok = AutoTokenizer.from_pretrained(gguf_file.materialize(path, {n for n, v in quant.GGML_TYPES.items()
                                                                     if quant.supported(v)}))
    yield request.param, path, model, tok
    del model


@pytest.mark.parametrize("kv", ["float32", "auto"])
async def test_next_token_logits_over_1024_tokens_agree_with_transformers(real, kv):
    """Both KV caches: fp32, and the default for a GGUF file on CPU (bf16, half the bytes attention reads)."""
    name, path, ref, tok = real
    ids = tok(_long_text(), add_special_tokens=True).input_ids[:1024]
    assert len(ids) == 1024
    with torch.inference_mode():
        want = torch.log_softmax(ref(torch.tensor([ids]), use_cache=False).logits[0].float(), -1)
    top = 8
    async with Kernel(model=path, dtype="float32", kv_cache_dtype=kv, kv_cache_memory_gb=KV_GB,
                      max_model_len=2048, max_num_batched_tokens=QUANT_CHUNK) as k:
        assert k.runner.placement.kv_dtype == (torch.float32 if kv == "float32" else torch.bfloat16)
        got = None
        async for ev in k.generate(prompt_token_ids=ids, max_tokens=1, temperature=0, prompt_logprobs=top):
            if type(ev).__name__ == "PromptLogprobs":
                got = ev
    assert got is not None
    agree, deltas = 0, []
    for t in range(len(ids) - 1):   # position t+1's entry holds the distribution after token t
        ours = got.logprobs[t + 1]
        ref_top = int(want[t].argmax())
        mine = {p.token_id: p.logprob for p in ours.top}
        agree += ours.top[0].token_id == ref_top
        deltas.append(abs(mine[ref_top] - float(want[t, ref_top])) if ref_top in mine else 10.0)
    rate, mean = agree / (len(ids) - 1), sum(deltas) / len(deltas)
    print(f"{name}, {kv} KV: top-1 agreement {rate:.4f}, mean |d logprob| {mean:.5f}")
    assert rate >= 0.99, rate
    assert mean <= 0.02, mean


async def test_each_greedy_token_is_transformers_choice_or_a_near_tie(real):
    """Eight prompts decoded at once (batched, as served), 64 greedy tokens each: at every position the token chosen is
    the argmax of transformers' distribution after the same prefix, or within 1e-3 of it in log-probability.

    NOTE: this implies the comparison with transformers' own greedy continuation, and checks more: up to the first
    token where the two differ the prefixes are the same, so there the reference's argmax is its greedy token and the
    gap is the one a greedy run would show; past it, where a greedy comparison has nothing left to say, every later
    token is still checked. The reference is one forward over prompt + continuation per prompt (the causal attention
    a step-by-step decode applies), not 64 sequential steps over Gemma's 262k-token head (~70 s of the slow tier)."""
    name, path, ref, tok = real
    prompts = [tok(p).input_ids for p in PROMPTS]
    async with Kernel(model=path, dtype="float32", kv_cache_dtype="float32", kv_cache_memory_gb=KV_GB,
                      max_model_len=512) as k:
        import anyio
        outs: dict[int, list[int]] = {}

        async def one(i: int) -> None:   # all eight at once: batched decode, as served
            outs[i] = (await k.complete(prompt_token_ids=prompts[i], max_tokens=NEW_TOKENS, temperature=0,
                                        ignore_eos=True)).token_ids
        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)
    worst = 0.0
    for i, ids in enumerate(prompts):
        got = list(outs[i])
        assert len(got) == NEW_TOKENS, (name, i, len(got))
        lp = _reference_logprobs_after_each_prefix(ref, ids, got)
        gaps = lp.max(-1).values - lp[torch.arange(len(got)), torch.tensor(got)]
        j = int(gaps.argmax())
        worst = max(worst, float(gaps[j]))
        if float(gaps[j]) > 0:
            print(f"{name} prompt {i}: largest reference gap {float(gaps[j]):.2e} at token {j}, "
                  f"{int((gaps > 0).sum())} of {len(got)} tokens off the reference's argmax")
        assert float(gaps[j]) <= 1e-3, (name, i, j, float(gaps[j]))
    print(f"{name}: largest reference gap over {len(prompts)} x {NEW_TOKENS} greedy tokens {worst:.2e}")


def _reference_logprobs_after_each_prefix(model, prompt: list[int], continuation: list[int]) -> torch.Tensor:
    """transformers' raw log-probabilities of the next token after prompt + continuation[:j], j = 0 .. n-1, as
    [n, vocab], from one forward with no cache (EOS is a token like any other here, as with ignore_eos)."""
    x = torch.tensor([prompt + continuation[:-1]])
    with torch.inference_mode():
        logits = model(x, use_cache=False, logits_to_keep=len(continuation)).logits[0]
    return torch.log_softmax(logits.float(), -1)
