"""The fp8 KV cache on CPU (kv_cache_dtype fp8 / fp8_e4m3 / fp8_e5m2: plugins/runner/csrc/attention_fp8.c): the C kernel
writes the codes torch's float8 types hold (rounded to nearest even, saturated), its decode attention over them
matches fp64 attention over what the cache holds, the portable row path (every variant) matches torch's, and a
kernel with an fp8 cache holds twice the blocks in the same memory and decodes close to the bf16 one."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from modelcall.core import ConfigError, KernelConfig
from modelcall.plugins.runner import attention, cpu_kernel, loader
from paged_cases import paged_case
from test_attention_decode import decode_case, fp64_reference, run

pytestmark = pytest.mark.skipif(cpu_kernel.load() is None, reason="no C compiler: no CPU kernel")
FORMATS = [torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.fixture
def threads():
    yield torch.set_num_threads
    torch.set_num_threads(1)


def spread(n: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """[n, 2, width/2] random values whose magnitudes run from far below the format's smallest subnormal to past its
    largest finite value (row by row), with exact ties of the format's rounding in row 0."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(n, width, generator=g) * torch.logspace(-22, 17, n, base=2).view(n, 1)
    # 1 + 2^-4 lies halfway between E4M3's 1 and 1.125 (E5M2: 1 + 2^-3 between 1 and 1.25); 1 + 3 * that: the
    # other tie direction; 2^-10 is halfway to E4M3's smallest subnormal
    ties = [1 + 2 ** -4, 1 + 3 * 2 ** -4, 1 + 2 ** -3, 1 + 3 * 2 ** -3, -(1 + 2 ** -4), 2 ** -10, 3 * 2 ** -10,
            2 ** -17, 460.0, 464.0, 1e6, -1e6, 57344.0, 61440.0, 0.0, -0.0]
    x[0, :len(ties)] = torch.tensor(ties)
    return x.to(dtype).view(n, 2, width // 2)


@pytest.mark.parametrize("cache_dtype", FORMATS, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("src_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("width", [64, 42], ids=["vector", "vector+scalar tail"])
def test_write_kv_stores_the_codes_torch_holds(cache_dtype, src_dtype, width):
    """The C write and the portable write (attention.store_rows) store the same bytes, and those are torch's own
    conversion of the values clamped to the largest finite one (E4M3 448, E5M2 57,344): ties to even, subnormals,
    saturation instead of inf. A row of 42 values also takes the scalar rounding for its last 10."""
    rows = spread(40, width, src_dtype)
    slots = torch.randperm(96, generator=torch.Generator().manual_seed(3))[:40]
    kc, vc = (torch.zeros(96, 2, width // 2, dtype=cache_dtype), torch.zeros(96, 2, width // 2, dtype=cache_dtype))
    cpu_kernel.write_kv(rows, -rows, kc, vc, slots)
    portable = torch.zeros_like(kc)
    attention.store_rows(portable, slots, rows)
    top = attention.FP8_MAX[cache_dtype]
    want = rows.float().clamp(-top, top).to(cache_dtype)
    assert torch.equal(kc[slots].view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(portable.view(torch.uint8), kc.view(torch.uint8))
    assert torch.equal(vc[slots].float(), -kc[slots].float())
    held = kc[slots].float()
    assert held.abs().max().item() == top and torch.isfinite(held).all()
    assert (held == 0).any() and ((held != 0) & (held.abs() < 2 ** -6)).any()   # flushed and subnormal values


@pytest.mark.parametrize("cache_dtype", FORMATS, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("hq,hkv,d", [(8, 8, 64), (6, 2, 64), (4, 1, 128), (3, 3, 96), (8, 8, 16)])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_decode_over_an_fp8_cache_equals_fp64_attention_over_its_values(cache_dtype, hq, hkv, d, n_threads, threads):
    """bf16 queries from the packed QKV rows over an fp8 cache, as the lean stack calls attention: the step's
    K/V land in the cache as fp8 codes, and every row's output is within fp32 rounding of fp64 attention over the
    values the cache holds (the fp8 rounding is the cache's, not the kernel's)."""
    threads(n_threads)
    ctx = [1, 15, 16, 17, 70, 300, 1100]
    q, k, v, kc, vc, step = decode_case(ctx, hq, hkv, d, cache_dtype=cache_dtype, seed=4)
    out = run(q, k, v, step, d)
    assert out.dtype == torch.bfloat16 and out.shape == (len(ctx), hq, d)
    top = attention.FP8_MAX[cache_dtype]
    assert torch.equal(kc[step.slot_mapping].view(torch.uint8),
                       k[0].transpose(0, 1).float().clamp(-top, top).to(cache_dtype).view(torch.uint8))
    ref = fp64_reference(q, kc, vc, step, d ** -0.5)
    # bf16 output: its own rounding (2^-8 relative) is the tolerance
    assert (out.double() - ref).abs().max().item() < 8e-3 * ref.abs().max().item()
    fp32 = cpu_kernel.attend_tokens(q[0].transpose(0, 1), kc, vc, step.paged_token_seq, step.paged_token_pos,
                                    step.paged_slots, d ** -0.5)
    assert (fp32.double() - ref).abs().max().item() < 2e-5 * ref.abs().max().item()


@pytest.mark.parametrize("cache_dtype", FORMATS, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("variant", ["softcap", "sinks", "window"])
def test_every_variant_over_an_fp8_cache_matches_torch(cache_dtype, variant):
    """Soft-capping and sink logits take the portable row kernel (the context widened to fp32 first), a sliding
    window the fast one; each matches attention._paged_torch over the same cache."""
    ctx_q = [(5, 1), (40, 1), (129, 1), (300, 1)]
    q_rows, kc, vc, step = paged_case(ctx_q, 16, 8, 4, 64, seed=6, dtype=torch.float32)
    kc, vc = kc.clamp(-400, 400).to(cache_dtype), vc.clamp(-400, 400).to(cache_dtype)
    n = len(ctx_q)
    step.paged_token_seq, step.paged_token_pos = torch.arange(n), torch.tensor([c - 1 for c, _ in ctx_q])
    sinks = torch.randn(8, generator=torch.Generator().manual_seed(7)) if variant == "sinks" else None
    var = attention.Variant(0.125, 64 if variant == "window" else None, 30.0 if variant == "softcap" else None, sinks)
    got = cpu_kernel.paged_attention(q_rows, kc, vc, step, var.scale, var.window or 0, var.softcap or 0.0, var.sinks)
    want = attention._paged_torch(q_rows, kc, vc, step, var, True)
    assert (got - want).abs().max().item() < 2e-5


def test_an_fp8_prefill_chunk_reads_its_prefix_from_the_cache():
    """A 48-token chunk over a 100-token cached prefix (an fp8 cache has no block_attention: torch's flash
    attention over the gathered, widened K/V) equals attention over the widened values."""
    ctx_q = [(148, 48), (30, 1)]
    q_rows, kc, vc, step = paged_case(ctx_q, 16, 4, 4, 32, seed=8, dtype=torch.float32)
    kc, vc = kc.to(torch.float8_e4m3fn), vc.to(torch.float8_e4m3fn)
    step.paged_token_seq = torch.tensor([0] * 48 + [1])
    step.paged_token_pos = torch.tensor(list(range(100, 148)) + [29])
    assert not cpu_kernel.has_block_attention(kc)
    var = attention.Variant(32 ** -0.5)
    got = attention._paged(q_rows, kc, vc, step, var, False)
    want = attention._paged_torch(q_rows, kc.float(), vc.float(), step, var, False)
    assert (got - want).abs().max().item() < 1e-5


def test_kv_cache_dtype_names_and_their_errors():
    """vLLM's names: fp8 is E4M3; fp8 is a CPU cache; an unknown name is a ConfigError that lists the choices."""
    hf = {"dtype": "bfloat16"}
    for name, want in (("fp8", torch.float8_e4m3fn), ("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)):
        p = loader.resolve_placement(KernelConfig(device="cpu", dtype="bfloat16", kv_cache_dtype=name), hf)
        assert p.kv_dtype == want and p.dtype == torch.bfloat16
    with pytest.raises(ConfigError, match="fp8_e5m2"):
        loader.resolve_placement(KernelConfig(device="cpu", kv_cache_dtype="int4"), hf)


@pytest.mark.anyio
async def test_an_fp8_cache_holds_twice_the_blocks(make_kernel, demo_model_dir):
    """The same kv_cache_memory_gb holds twice the blocks with one byte per value, and the kernel decodes over it;
    the first token comes from the prompt's own fresh K/V (not read back from the cache), so it is the bf16 run's."""
    runs = {}
    for kv in ("bfloat16", "fp8"):
        async with make_kernel(model=demo_model_dir, dtype="float32", kv_cache_dtype=kv,
                               num_kv_blocks=None, kv_cache_memory_gb=0.0625) as kernel:
            assert kernel.runner.kv[0][0].dtype == (torch.float8_e4m3fn if kv == "fp8" else torch.bfloat16)
            done = await kernel.complete(prompt_token_ids=list(range(40, 110)), max_tokens=24, temperature=0,
                                         ignore_eos=True)
            runs[kv] = (kernel.kv.stats()["num_blocks"], done)
    (bf_blocks, bf), (f8_blocks, f8) = runs["bfloat16"], runs["fp8"]
    assert f8_blocks == 2 * bf_blocks
    assert len(f8.token_ids) == 24 and f8.token_ids[0] == bf.token_ids[0]


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
def test_ragged_steps_over_an_fp8_cache_give_the_portable_paths_logits(demo_model_dir, monkeypatch, kv):
    """Random mixed steps (prefill chunks over cached prefixes, whole prompts, decodes, shuffled) through the runner
    twice: with the C kernel (its fp8 writes, decode rows and chunk paths) and with the kernel unloaded (torch's
    fp8 conversion and attention over the gathered cache). Both read the same codes, so every sampled row's logits
    agree to fp32 rounding (the fp8 rounding itself is shared, and large: see the next test)."""
    from test_lean import lockstep_logits
    from test_runner import make_runner

    class Unloaded:
        """A runner whose steps run with the C kernel unloaded (cpu_kernel.load() is None: the portable path)."""

        def __init__(self, runner) -> None:
            self.runner, self.spec = runner, runner.spec

        def compute_logits(self, plan):
            with monkeypatch.context() as m:
                m.setattr(cpu_kernel, "load", lambda: None)
                assert not cpu_kernel.usable(torch.zeros(1, 1, 1), self.runner.kv[0][0])
                return self.runner.compute_logits(plan)

    fast, portable = make_runner(demo_model_dir, kv_cache_dtype=kv), make_runner(demo_model_dir, kv_cache_dtype=kv)
    assert fast.kv[0][0].dtype in FORMATS
    steps = lockstep_logits([fast, Unloaded(portable)], seed=11)
    assert sum(a.shape[0] for a, _ in steps) > 30
    for a, b in steps:
        assert ((a - b).abs().max() / b.abs().max().clamp(min=1.0)).item() < 1e-4


def test_fp64_reference_sees_the_fp8_rounding():
    """The check above is not vacuous: attention over the fp8-rounded cache differs from attention over the
    unrounded values by far more than the kernel's tolerance (so a kernel reading the wrong bytes would fail)."""
    q, k, v, kc, vc, step = decode_case([300], 8, 8, 64, dtype=torch.float32, seed=9)
    exact = fp64_reference(q, kc, vc, step, 0.125)
    rounded = fp64_reference(q, kc.to(torch.float8_e4m3fn), vc.to(torch.float8_e4m3fn), step, 0.125)
    assert (exact - rounded).abs().max().item() > 100 * 2e-5 * exact.abs().max().item()
    assert F.cosine_similarity(exact.flatten(), rounded.flatten(), dim=0).item() > 0.99


def test_the_command_line_takes_the_fp8_names():
    """`modelcall serve --kv-cache-dtype fp8` (and the other commands' kernel options) reach the config; a name
    outside vLLM's set is refused by the parser."""
    import argparse

    from modelcall.core.commands import add_kernel_options, config_from_args

    parser = argparse.ArgumentParser()
    add_kernel_options(parser)
    for name in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        assert config_from_args(parser.parse_args(["--kv-cache-dtype", name])).kv_cache_dtype == name
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "int8"])
