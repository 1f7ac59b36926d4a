"""LoRA on MoE experts (PEFT's `target_parameters`): adapters PEFT builds on tiny Qwen3-MoE and gpt-oss checkpoints,
LoRA on the fused expert tensors (and attention), served beside the base model and an attention-only adapter.

Each adapter's greedy output through the kernel equals transformers' `generate` on PEFT's `merge_and_unload()` model
(fp32) while the three share steps under chunked prefill; one expert's delta dropped changes the output.
"""
from __future__ import annotations

import random

import anyio
import pytest

from family_models import build_family
from lora_adapters import build_adapter, reference_outputs
from modelcall.core import Kernel

pytestmark = pytest.mark.anyio

MAX_TOKENS = 12
_rng = random.Random(3939)
PROMPTS = [[_rng.randrange(10, 2048) for _ in range(n)] for n in (23, 9, 31)]
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
ADAPTERS = {   # name -> LoraConfig fields
    "moe8": dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], target_parameters=EXPERTS),
    "down4": dict(r=4, lora_alpha=8, use_rslora=True, target_modules=[], target_parameters=["mlp.experts.down_proj"]),
    "attn8": dict(r=8, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
}
NAMES = [None, *ADAPTERS]


@pytest.fixture(scope="module", params=["qwen3_moe", "gpt_oss"])
def served(request, tmp_path_factory, demo_model_dir) -> tuple[str, dict[str, str], dict]:
    """(base dir, adapter dirs, reference continuations by adapter name (None: the base) and prompt)."""
    root = tmp_path_factory.mktemp(request.param)
    base = build_family(request.param, str(root / "base"), demo_model_dir)
    adapters = {name: build_adapter(base, str(root / name), seed=i + 7, b_std=0.5, **spec)
                for i, (name, spec) in enumerate(ADAPTERS.items())}
    refs = {name: reference_outputs(base, adapters.get(name), PROMPTS, MAX_TOKENS) for name in NAMES}
    for name in ADAPTERS:   # every adapter changes the output, or the comparison would prove nothing
        assert refs[name] != refs[None], name
    return base, adapters, refs


async def _run_all(kernel: Kernel, jobs: list[tuple[str | None, int]]) -> dict[tuple[str | None, int], list[int]]:
    results: dict[tuple[str | None, int], list[int]] = {}

    async def one(name: str | None, i: int) -> None:
        done = await kernel.complete(prompt_token_ids=PROMPTS[i], lora=name, max_tokens=MAX_TOKENS, temperature=0,
                                     ignore_eos=True)
        results[(name, i)] = done.token_ids

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            for name, i in jobs:
                tg.start_soon(one, name, i)
    return results


async def test_expert_adapters_in_mixed_steps_equal_peft_merged_generate(served, make_kernel):
    base, adapters, refs = served
    jobs = [(name, i) for i in range(len(PROMPTS)) for name in NAMES]
    async with make_kernel(model=base, dtype="float32", block_size=4, max_num_batched_tokens=16,
                           lora_modules=adapters) as kernel:
        lora = kernel.runner.lora
        assert lora.expert_shapes, "the MoE layers' experts were meant to take LoRA"
        mixed, begin = [], lora.begin

        def recording(plan, step):
            begin(plan, step)
            mixed.append(len(lora.ctx.groups) >= 2 and any(c.request.lora is None for c in plan.chunks))

        lora.begin = recording
        done = await _run_all(kernel, jobs)
        info = kernel.loras.info("moe8")
    assert {k: v for k, v in done.items()} == {(n, i): refs[n][i] for n, i in jobs}
    assert any(mixed), "no step mixed two adapters and the base model"
    assert info.targets == ("q_proj", "v_proj", "experts.gate_up_proj", "experts.down_proj")


async def test_one_expert_dropped_is_caught(served, make_kernel, monkeypatch):
    """The deliberate break: expert 1's delta on down_proj dropped from one adapter changes that adapter's output."""
    from lora_adapters import break_adapter

    base, adapters, refs = served

    def drop_expert(w) -> None:
        for (_, param), (_, b) in w.experts.items():
            if param == "down_proj":
                b[1].zero_()

    break_adapter(monkeypatch, "moe8", drop_expert)
    async with make_kernel(model=base, dtype="float32", lora_modules=adapters) as kernel:
        done = await _run_all(kernel, [(name, i) for name in ("moe8", "down4") for i in range(len(PROMPTS))])
    assert [done[("moe8", i)] for i in range(len(PROMPTS))] != refs["moe8"]
    assert [done[("down4", i)] for i in range(len(PROMPTS))] == refs["down4"]
