"""On CUDA (issue 16): greedy parity with transformers (fp32 exact; bf16 equal up to a near-tie) through each
attention path (the Triton kernel, the default on CUDA; the portable torch path) and with decode CUDA graphs;
the Triton kernel compiled against the torch path on the interpreter tests' cases; one host sync per graph step.

Marked `gpu` and skipped without CUDA, so CPU CI is unchanged; scripts/device_check.sh runs them on a
GPU machine (`pytest -m gpu tests/test_gpu.py`, alone: the CPU interpreter tests set TRITON_INTERPRET=1 in
their process). The model is the random-weight demo model; requests run concurrently
through a small token budget, so prefill chunks and decodes share steps on the CUDA path.

bf16 tolerance: the two greedy sequences are equal up to their first difference, and there the fp32
reference's logit of transformers' token exceeds that of modelcall's by at most 2% of the reference's
largest |logit| (bf16 rounding may flip a near-tie; anything wider is a wrong kernel).
"""
from __future__ import annotations

import random

import anyio
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.anyio,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

BF16_TIE_TOLERANCE = 2e-2
MAX_TOKENS = 24
_rng = random.Random(16)
PROMPTS = [[_rng.randrange(10, 2048) for _ in range(n)] for n in (1, 7, 33, 64, 130)]


def _reference(model_dir: str, dtype: torch.dtype) -> tuple[object, list[list[int]]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=dtype).to("cuda").eval()
    model.generation_config.eos_token_id = None
    out = []
    for prompt in PROMPTS:
        ids = torch.tensor([prompt], device="cuda")
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS, do_sample=False)
        out.append(gen[0, len(prompt):].tolist())
    return model, out


RUNNER_CONFIGS = {"triton": {}, "torch": {"attention": "torch"}, "triton_graphs": {"cuda_graphs": True}}


async def _ours(make_kernel, model_dir: str, dtype: str, runner_cfg: dict | None = None) -> list[list[int]]:
    results: list[list[int]] = [[] for _ in PROMPTS]

    async def one(i: int) -> None:
        done = await kernel.complete(prompt_token_ids=PROMPTS[i], max_tokens=MAX_TOKENS, temperature=0,
                                     ignore_eos=True)
        results[i] = list(done.token_ids)

    async with make_kernel(model=model_dir, device="cuda", dtype=dtype, max_num_batched_tokens=48,
                           plugin_config={"runner": runner_cfg or {}}) as kernel:
        assert kernel.runner.spec.device.startswith("cuda")
        assert kernel.runner.attention_backend == (None if (runner_cfg or {}).get("attention") == "torch" else "triton")
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for i in range(len(PROMPTS)):
                    tg.start_soon(one, i)
        graphs = kernel.runner.graphs
        if graphs is not None:
            assert graphs.error is None, graphs.error
            assert graphs.replays > 0
    return results


@pytest.mark.parametrize("path", sorted(RUNNER_CONFIGS))
async def test_fp32_greedy_equals_transformers_on_cuda(make_kernel, demo_model_dir, path):
    _, theirs = _reference(demo_model_dir, torch.float32)
    ours = await _ours(make_kernel, demo_model_dir, "float32", RUNNER_CONFIGS[path])
    assert ours == theirs


@pytest.mark.parametrize("path", sorted(RUNNER_CONFIGS))
async def test_bf16_greedy_matches_transformers_up_to_a_near_tie(make_kernel, demo_model_dir, path):
    _, theirs = _reference(demo_model_dir, torch.bfloat16)
    ours = await _ours(make_kernel, demo_model_dir, "bfloat16", RUNNER_CONFIGS[path])
    fp32, _ = _reference(demo_model_dir, torch.float32) if ours != theirs else (None, None)
    for prompt, a, b in zip(PROMPTS, ours, theirs):
        assert len(a) == len(b) == MAX_TOKENS
        i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if i is None:
            continue
        with torch.inference_mode():
            logits = fp32(torch.tensor([prompt + a[:i]], device="cuda")).logits[0, -1].float()
        gap = float((logits[b[i]] - logits[a[i]]) / logits.abs().max())
        assert gap <= BF16_TIE_TOLERANCE, f"prompt of {len(prompt)}: token {i} differs by {gap:.3g} of max |logit|"


def _compiled_triton():
    from modelcall.plugins.runner import cuda_attention
    if not cuda_attention.available():
        pytest.skip("triton does not import")
    if cuda_attention.interpreting():
        pytest.skip("TRITON_INTERPRET=1 in this process (the CPU interpreter tests ran first): run this file alone")


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 1.5e-2)], ids=["fp32", "bf16"])
def test_triton_kernel_compiled_matches_the_torch_path(dtype, tol):
    """The interpreter tests' cases, compiled for the GPU (the reference: the torch path in fp32 on the same
    rounded inputs; bf16 output rounding is 2**-8 of |out|)."""
    _compiled_triton()
    from paged_cases import DECODE, MIXED, compare
    for ctx_q in (DECODE, MIXED):
        for block_size in (4, 16):
            compare(ctx_q, block_size, tol=tol, device="cuda", dtype=dtype)
        compare(ctx_q, 4, 8, 1, 24, window=8, tol=tol, device="cuda", dtype=dtype)
        compare(ctx_q, 4, 4, 2, 128, softcap=2.0, scale=24 ** -0.5, window=3, tol=tol, device="cuda", dtype=dtype)
        compare(ctx_q, 16, 8, 2, 64, sinks=True, window=8, tol=tol, device="cuda", dtype=dtype)


def test_a_graph_decode_step_syncs_the_host_once(demo_model_dir):
    """torch's sync debug mode warns at every host synchronization: a replayed decode step (pinned, non-blocking
    input copies; the sampler's one .tolist()) must warn once."""
    import warnings

    from paged_cases import run_steps

    from modelcall.core import KernelConfig, Request, SamplingParams
    from modelcall.plugins.runner.runner import TorchModelRunner
    from modelcall.plugins.sampler.sampler import TorchSampler

    _compiled_triton()
    cfg = KernelConfig(model=demo_model_dir, device="cuda", dtype="bfloat16", max_num_seqs=4,
                       plugin_config={"runner": {"cuda_graphs": True}})
    runner = TorchModelRunner(cfg, demo_model_dir, TorchSampler())
    runner.allocate_kv_cache(64, 16)
    reqs = [Request(f"r{i}", PROMPTS[i], SamplingParams(temperature=0), max_tokens=8) for i in range(3)]
    counts = []

    def measure(step, execute):
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                out = execute()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        counts.append(sum("synchroniz" in str(w.message) for w in seen))
        return out

    run_steps(runner, reqs, 5, 16, measure)
    assert runner.graphs.error is None and runner.graphs.replays >= 2, runner.graphs.error
    assert counts[-1] == 1, f"host syncs per step (prefill first, then decodes, the last two replayed): {counts}"


async def test_grammar_constrained_greedy_output_on_cuda_equals_cpu(make_kernel, demo_model_dir):
    """The grammar mask reaches the CUDA logits as packed words unpacked on the device (plugins/structured/
    masks.py): the same JSON, token for token, as on the CPU, fp32 greedy."""
    import json

    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                               "days": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["city", "days"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": schema, "strict": True}}
    msgs = [{"role": "user", "content": "Weather in Paris for three days?"}]
    outputs = []
    for device in ("cpu", "cuda"):
        async with make_kernel(model=demo_model_dir, device=device, dtype="float32") as kernel:
            with anyio.fail_after(120):
                done = await kernel.complete(messages=msgs, response_format=fmt, max_tokens=48, temperature=0)
        assert done.finish_reason == "stop", done
        outputs.append(list(done.token_ids))
        json.loads(done.text)
    assert outputs[0] == outputs[1]
