"""`--quantization q8_0 | q4_k`: a safetensors model's linears quantized at load, computed by the quantized kernels,
with the memory of the block format and the answers of the dequantized weights."""
from __future__ import annotations

import pytest
import torch

from modelcall.core import ConfigError, Kernel
from modelcall.plugins.runner import quant

pytestmark = pytest.mark.anyio

KV_GB = 1 / 32


@pytest.fixture(scope="module")
def llama256(tmp_path_factory) -> str:
    """A tiny random Llama whose every linear has whole Q4_K blocks (inputs 256 and 512)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from modelcall.plugins.demo_model import demo_model_dir
    from transformers import AutoTokenizer

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      initializer_range=0.5, tie_word_embeddings=False, eos_token_id=2, pad_token_id=0)
    out = tmp_path_factory.mktemp("llama256")
    LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(out)
    AutoTokenizer.from_pretrained(demo_model_dir()).save_pretrained(out)
    return str(out)


async def _logprobs(kernel: Kernel, ids: list[int]) -> list[float]:
    async for ev in kernel.generate(prompt_token_ids=ids, max_tokens=1, temperature=0, prompt_logprobs=0):
        if type(ev).__name__ == "PromptLogprobs":
            return [p.logprob for p in ev.logprobs[1:]]
    raise AssertionError("no prompt logprobs")


@pytest.mark.parametrize("scheme,qtype", [("q8_0", "Q8_0"), ("q4_k", "Q4_K")])
async def test_quantized_at_load_computes_what_the_dequantized_weights_give(llama256, scheme, qtype):
    ids = list(range(10, 74))
    async with Kernel(model=llama256, dtype="float32", kv_cache_memory_gb=KV_GB, max_model_len=256) as plain:
        want = await _logprobs(plain, ids)
        dense_bytes = plain.runner.weight_bytes
        plain_identity = plain.spec.identity
    async with Kernel(model=llama256, dtype="float32", kv_cache_memory_gb=KV_GB, max_model_len=256,
                      quantization=scheme) as k:
        model = k.runner.model
        linears = [m for m in model.modules() if isinstance(m, quant.QuantLinear)]
        assert len(linears) == 2 * 7 + 1   # q, k, v, o, gate, up, down per layer + lm_head
        # kept in the format, or its r16 layout for decode (quant_repack.py) where the CPU has those kernels
        assert {quant.type_name(m.qweight.qtype).removesuffix("/r16") for m in linears} == {qtype}
        assert not any(type(m) is torch.nn.Linear for m in model.modules())
        weights = sum(m.in_features * m.out_features for m in linears)
        got = await _logprobs(k, ids)
        assert k.spec.identity != plain_identity   # no prefix block is shared with the unquantized model
        bytes_q = k.runner.weight_bytes
        layout = linears[0].qweight.qtype   # the format's, or its r16 layout's (Q4_K: 148 bytes a block, not 144)
    # quantization moves the log-probabilities by what its rounding allows (relative to their scale on these
    # chaotic random weights, where they reach -100), not more: Q8_0 by far less than Q4_K
    rel = sum(abs(a - b) for a, b in zip(got, want)) / sum(abs(b) for b in want)
    print(f"{scheme}: mean relative change of the log-probabilities {rel:.4f}")
    assert rel < (0.03 if scheme == "q8_0" else 0.25), rel   # measured 0.013 and 0.130
    # resident: the fp32 linears' 4 bytes a weight became the format's (34/32 for Q8_0, 144/256 for Q4_K, 148/256 for
    # Q4_K's r16 layout)
    block, size = quant.block_info(layout)
    expected = dense_bytes - 4 * weights + weights * size // block
    assert abs(bytes_q - expected) <= 4096, (bytes_q, expected, dense_bytes)


@pytest.mark.parametrize("runner,bar", [({"repack": False}, 1e-3), ({}, 0.05)])
async def test_quantized_linears_equal_their_dequantized_weights_through_the_engine(llama256, runner, bar):
    """The engine's path (lean stack, kernels) against plain torch on the dequantized weights: the kernels' error
    only (fp32 sums in another order), not the rounding's. The r16 layouts (the default where the CPU has them) add
    int16 activations: an error of 1 / 65534 of each 32 values' largest, which this random model's chaotic
    logprobs (down to -100) turn into up to ~0.02."""
    from transformers import AutoModelForCausalLM

    ids = list(range(100, 140))
    async with Kernel(model=llama256, dtype="float32", kv_cache_memory_gb=KV_GB, max_model_len=256,
                      quantization="q8_0", plugin_config={"runner": runner}) as k:
        got = await _logprobs(k, ids)
        ref = AutoModelForCausalLM.from_pretrained(llama256, dtype=torch.float32).eval()
        for name, m in list(k.runner.model.named_modules()):
            if isinstance(m, quant.QuantLinear):
                ref.get_submodule(name).weight.data = m.qweight.dequantize()
    with torch.inference_mode():
        lp = torch.log_softmax(ref(torch.tensor([ids])).logits[0], -1)
    want = [float(lp[i, ids[i + 1]]) for i in range(len(ids) - 1)]
    assert max(abs(a - b) for a, b in zip(got, want)) < bar


async def test_an_unknown_scheme_is_refused_with_the_choices(llama256):
    with pytest.raises(Exception) as e:
        async with Kernel(model=llama256, kv_cache_memory_gb=KV_GB, quantization="q3_xs"):
            pass
    assert "q8_0" in str(e.value) and "q4_k" in str(e.value)
    assert isinstance(e.value, ConfigError) or isinstance(e.value.__cause__, ConfigError)


def test_the_command_line_flag_reaches_the_kernel_config():
    """`--quantization` of every command that loads a model (core/commands.py): q8_0 and q4_k, nothing else."""
    import argparse
    from modelcall.core.commands import add_kernel_options, config_from_args

    parser = argparse.ArgumentParser()
    add_kernel_options(parser)
    for scheme in ("q8_0", "q4_k"):
        assert config_from_args(parser.parse_args(["--quantization", scheme])).quantization == scheme
    assert config_from_args(parser.parse_args([])).quantization is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--quantization", "q3_xs"])
