"""Every family the engine serves from safetensors that llama.cpp also writes as GGUF loads from GGUF: a tiny random
model of each, written as llama.cpp's converter writes it (tests/gguf_writer.py: Q/K permutation, Gemma's 1 + w
norms, fused phi3 tensors, stacked experts; F32, F16 and Q8_0 tensors), served by modelcall from the file, against
transformers loading the SAME file (`gguf_file=`, fp32): an independent reading of the name map, the un-permutation
and the dequantization. Where transformers cannot read a family's file (olmo2: its GGUF config reader has no
olmo2 entry; gpt-oss: it fails on the rope.scaling values) the reference is the HF model the file was written
from, its tensors written exactly (F32, and gpt-oss's experts as MXFP4 from weights on MXFP4's grid).
Files whose architecture or tensor type is not served are refused at start with one line naming it."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from modelcall.core import ConfigError, Kernel, ModelNotFound

import gguf_writer as gw

pytestmark = pytest.mark.anyio

# llama.cpp arch -> (matrix type, token-embedding type, config fields transformers' GGUF reader misses or None when
# transformers cannot read the file at all)
FAMILIES: dict[str, tuple[str, str, dict | None]] = {
    "llama": ("Q8_0", "F16", {}),
    "mistral": ("F16", "Q8_0", {}),
    "qwen2": ("Q8_0", "F32", {}),
    # NOTE: transformers 5.25 reads no attention.key_length for qwen3 (head_dim stays its default 128) and no
    # expert_feed_forward_length for qwen3moe (moe_intermediate_size stays 768): given to it here as the file says.
    "qwen3": ("Q8_0", "Q8_0", {"head_dim": gw.HEAD_DIM}),
    "qwen3moe": ("Q8_0", "F16", {"moe_intermediate_size": 32}),
    "phi3": ("Q8_0", "F16", {}),
    "gemma2": ("F16", "Q8_0", {}),
    "gemma3": ("Q8_0", "F16", {}),
    "olmo2": ("F32", "F32", None),
    # transformers' GGUF reader fails on gpt-oss's rope.scaling values: the reference is the HF source, whose expert
    # weights lie on MXFP4's grid (gguf_writer.build_model), written as MXFP4 like the real files
    "gpt-oss": ("F32", "F32", None),
}
EXPERT_TYPES = {"gpt-oss": "MXFP4"}   # the others' experts: their matrix type
DEQUANTIZED = ("gpt-oss",)            # MXFP4 experts dequantized at load (gguf_experts.py): more than the file
PROMPT_LEN, NEW_TOKENS, TOP = 64, 16, 5
# NOTE: the plain layouts' exact fp32 kernels (repack off): this checks the loader (names, permutations, norms) at
# 1e-3; the r16 layouts' int16 activations move these random models' -100-scale logprobs by up to ~1e-3 more, and
# have their own tests (test_quant_r16.py, test_decode_stack.py, the real files in test_gguf_models.py)
KERNEL = dict(dtype="float32", kv_cache_dtype="float32", kv_cache_memory_gb=1 / 64, max_model_len=256,
              plugin_config={"runner": {"repack": False}})


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf_families")
    old = os.environ.get("MODELCALL_CACHE_DIR")
    os.environ["MODELCALL_CACHE_DIR"] = str(d / "cache")   # the described directories, away from the user's cache
    yield d
    if old is None:
        os.environ.pop("MODELCALL_CACHE_DIR", None)
    else:
        os.environ["MODELCALL_CACHE_DIR"] = old


def _reference(arch: str, path: str, source: torch.nn.Module) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    overrides = FAMILIES[arch][2]
    if overrides is None:
        return source
    return AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                dtype=torch.float32, **overrides).eval()


@pytest.mark.parametrize("arch", list(FAMILIES))
async def test_family_from_gguf_agrees_with_transformers_on_the_same_file(arch, workdir):
    matrix, embedding, _ = FAMILIES[arch]
    source = gw.build_model(arch)
    path = gw.write(source, arch, str(workdir / f"{arch}-tiny.gguf"), matrix_type=matrix, embedding_type=embedding,
                    expert_type=EXPERT_TYPES.get(arch))
    ref = _reference(arch, path, source)
    ids = np.random.default_rng(7).integers(0, gw.EOS, PROMPT_LEN).tolist()
    with torch.inference_mode():
        want = torch.log_softmax(ref(torch.tensor([ids]), use_cache=False).logits[0].float(), -1)
        greedy = ids[:16]
        for _ in range(NEW_TOKENS):   # plain argmax steps: generate()'s min_new_tokens would forbid EOS, ours may emit it
            greedy = greedy + [int(ref(torch.tensor([greedy]), use_cache=False).logits[0, -1].argmax())]
        greedy = greedy[16:]
    async with Kernel(model=path, **KERNEL) as k:
        got = None
        async for ev in k.generate(prompt_token_ids=ids, max_tokens=1, temperature=0, prompt_logprobs=TOP):
            if type(ev).__name__ == "PromptLogprobs":
                got = ev
        done = await k.complete(prompt_token_ids=ids[:16], max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
        resident = k.runner.weight_bytes
    print(f"{arch}: resident weights {resident} B, file {os.path.getsize(path)} B")
    if arch not in DEQUANTIZED:   # kept as the file holds them (qwen3moe's experts included)
        assert resident <= 1.1 * os.path.getsize(path), (arch, resident)
    assert got is not None
    worst = 0.0
    for t in range(PROMPT_LEN - 1):   # entry t+1 holds the distribution after token t
        top = got.logprobs[t + 1].top
        assert top[0].token_id == int(want[t].argmax()), (arch, t)
        for p in top:
            worst = max(worst, abs(p.logprob - float(want[t, p.token_id])))
    print(f"{arch}: max |d logprob| over {PROMPT_LEN - 1} positions x top {TOP}: {worst:.2e}")
    assert worst <= 1e-3, (arch, worst)
    assert list(done.token_ids) == greedy, arch


def _refused(path: str) -> str:
    import anyio

    async def start() -> None:
        async with Kernel(model=path, **KERNEL):
            pass
    with pytest.raises((ConfigError, ModelNotFound)) as e:
        anyio.run(start)
    return str(e.value)


def test_a_file_of_an_architecture_not_served_is_refused_naming_it(workdir):
    path = gw.write(gw.build_model("llama"), "llama", str(workdir / "made-up.gguf"), architecture="made-up-arch")
    msg = _refused(path)
    assert "'made-up-arch'" in msg and "not supported" in msg and "\n" not in msg, msg


def test_a_file_with_a_tensor_type_the_kernels_lack_is_refused_naming_it(workdir):
    path = gw.write(gw.build_model("llama"), "llama", str(workdir / "q8_1.gguf"), matrix_type="Q8_1")
    msg = _refused(path)
    assert "Q8_1" in msg and "not supported" in msg and "\n" not in msg, msg
