"""A greedy decode burst's later steps in one C call (plugins/runner/decode_burst.py): the same tokens as the Python
steps of a burst and as single steps, on a tiny Llama GGUF file with a quantized token table (the lean stack's
decode stack, r16 weights), its token table Q8_0 or F16; rows that sample, or a model it does not cover, keep the
Python steps."""
from __future__ import annotations

import numpy as np
import pytest

from modelcall.core import Kernel
from modelcall.plugins.runner import cpu_kernel, decode_burst, fused_ops

import gguf_writer as gw

pytestmark = [pytest.mark.anyio,
              pytest.mark.skipif(fused_ops.load() is None or cpu_kernel.load() is None, reason="no C compiler here")]

KERNEL = dict(dtype="float32", kv_cache_dtype="float32", kv_cache_memory_gb=1 / 64, max_model_len=256, block_size=4)


@pytest.fixture(scope="module", params=["Q8_0", "F16"])
def tiny_llama(tmp_path_factory, request) -> str:
    """A tiny Llama GGUF with Q8_0 matrices and a Q8_0 or F16 token table (tied head), both dequantized rows in C."""
    d = tmp_path_factory.mktemp("burst_c")
    return gw.write(gw.build_model("llama"), "llama", str(d / f"llama-{request.param}.gguf"), matrix_type="Q8_0",
                    embedding_type=request.param)


def counting(monkeypatch) -> dict[str, int]:
    calls = {"ran": 0}
    run = decode_burst.GreedyBurst.run

    def counted(self, *a):
        out = run(self, *a)
        calls["ran"] += out is not None
        return out
    monkeypatch.setattr(decode_burst.GreedyBurst, "run", counted)
    return calls


async def _outputs(path: str, prompts: list[list[int]], temps: list[float], **config) -> tuple[list, object]:
    async with Kernel(model=path, **KERNEL, **config) as k:
        done = []
        for p, t in zip(prompts, temps):
            done.append(k.complete(prompt_token_ids=p, max_tokens=40, temperature=t, seed=3, ignore_eos=True))
        import anyio
        out: list = [None] * len(done)

        async def one(i, coro):
            out[i] = (await coro).token_ids
        async with anyio.create_task_group() as tg:
            for i, c in enumerate(done):
                tg.start_soon(one, i, c)
        return out, k.runner.greedy_burst


@pytest.mark.parametrize("temps", [[0.0], [0.0, 0.0, 0.0], [0.0, 0.8]])
async def test_c_bursts_give_the_python_steps_tokens(tiny_llama, monkeypatch, temps):
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, gw.EOS, int(n)).tolist() for n in rng.integers(5, 30, len(temps))]
    calls = counting(monkeypatch)
    fast, burst = await _outputs(tiny_llama, prompts, temps)
    assert burst is not None, "the tiny Llama GGUF (quantized table, lean decode stack) takes the C burst"
    if all(t == 0 for t in temps):
        assert calls["ran"] > 0
    else:   # a sampling row: the burst's later steps stay Python (the sampler draws them)
        assert calls["ran"] == 0
    python, off = await _outputs(tiny_llama, prompts, temps, plugin_config={"runner": {"decode_burst": False}})
    single, _ = await _outputs(tiny_llama, prompts, temps, num_scheduler_steps=1)
    assert off is None
    assert fast == python == single


async def test_a_model_outside_its_reach_keeps_python_bursts(tmp_path):
    # Gemma 3 scales its embeddings and has its own stack (lean_gemma): no C burst
    path = gw.write(gw.build_model("gemma3"), "gemma3", str(tmp_path / "gemma3.gguf"), matrix_type="Q8_0",
                    embedding_type="Q8_0")
    async with Kernel(model=path, **KERNEL) as k:
        assert k.runner.lean is not None and k.runner.lean.cstack is not None and k.runner.greedy_burst is None


@pytest.mark.parametrize("bf16", [False, True])
def test_the_bursts_argmax_is_the_first_maximum(bf16):
    """decode_burst's choice of a row is torch.argmax's: the first of equal maxima, wherever they sit (the vector
    part, the tail past the last 16 values, index 0), negative rows and a row of one value included."""
    import ctypes

    import torch

    from modelcall.plugins.runner import decode_stack
    lib = decode_stack._LIB.get()
    if lib is None:
        pytest.skip("no C compiler here")
    dtype = torch.bfloat16 if bf16 else torch.float32
    gen = torch.Generator().manual_seed(5)
    rows = []
    for n in (1, 7, 16, 17, 49152, 49157):
        for ties in ((), (0, n - 1), (3, n - 1), (n // 2, n - 1)):
            row = torch.randn(n, generator=gen) * 4 - 2
            for i in ties:
                if i < n:
                    row[i] = 9.5
            rows.append(row)
    rows += [torch.full((40,), -3.0), torch.tensor([-0.0, 0.0, -1.0] * 11)]
    for row in rows:
        r = row.to(dtype).contiguous()
        got = lib.decode_first_max(ctypes.c_void_p(r.data_ptr()), r.numel(), int(bf16))
        assert got == int(torch.argmax(r)), (r.numel(), got)
