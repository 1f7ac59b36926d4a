"""CPU linears: pre-packed weights and fused sibling GEMMs (q/k/v, gate/up) give the same numbers, in bf16 where
this CPU can pack bf16 (oneDNN needs AVX-512 or AVX-NE-CONVERT for it) and in fp32 everywhere."""
import copy

import pytest
import torch

from modelcall.plugins.runner import packing

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch build")
BF16 = pytest.param(torch.bfloat16, id="bf16", marks=pytest.mark.skipif(
    not packing.can_pack(torch.bfloat16), reason="oneDNN cannot pack bf16 weights on this CPU (no AVX-512)"))
DTYPES = [BF16, pytest.param(torch.float32, id="fp32")]


class Block(torch.nn.Module):
    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.q_proj = torch.nn.Linear(64, 64, bias=bias)
        self.k_proj = torch.nn.Linear(64, 32, bias=bias)
        self.v_proj = torch.nn.Linear(64, 32, bias=bias)
        self.gate_proj = torch.nn.Linear(64, 96, bias=False)
        self.up_proj = torch.nn.Linear(64, 96, bias=False)
        self.down_proj = torch.nn.Linear(96, 64, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        h = x + q * torch.cat([k, v], -1)
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))


def pack_separately(model, monkeypatch, dtype=torch.bfloat16):
    with monkeypatch.context() as m:
        m.setattr(packing, "fuse_siblings", lambda *a, **k: 0)
        packing.pack_linears(model, dtype=dtype)
    assert isinstance(model.get_submodule(next(n for n, _ in model.named_modules() if n.endswith("k_proj"))),
                      packing.PackedLinear)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
def test_fused_siblings_equal_separate_packed_linears(bias, dtype, monkeypatch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(bias), Block(bias)).to(dtype)
    separate, fused = copy.deepcopy(model), copy.deepcopy(model)
    pack_separately(separate, monkeypatch, dtype)
    assert packing.fuse_siblings(fused, threads=2, dtype=dtype) == 4
    packing.pack_linears(fused, dtype=dtype)
    assert isinstance(fused[0].k_proj, packing.FusedPart) and isinstance(fused[1].up_proj, packing.FusedPart)
    assert isinstance(fused[0].down_proj, packing.PackedLinear)
    with torch.inference_mode():
        for rows in (1, 5, 32, 70):
            x = torch.randn(1, rows, 64).to(dtype)
            assert torch.equal(fused(x), separate(x))
            assert fused[0].q_proj.fused._x is None   # nothing held once every sibling read its slice


@pytest.mark.parametrize("dtype", DTYPES)
def test_gate_up_stay_separate_on_one_thread(dtype):
    model = Block(False).to(dtype)
    assert packing.fuse_siblings(model, threads=1, dtype=dtype) == 1
    assert isinstance(model.q_proj, packing.FusedPart) and type(model.gate_proj) is torch.nn.Linear


@pytest.mark.skipif(not packing.can_pack(torch.bfloat16), reason="oneDNN cannot pack bf16 weights on this CPU")
def test_fused_demo_model_logits_equal_unfused(demo_model_dir, monkeypatch):
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(demo_model_dir, local_files_only=True, dtype=torch.bfloat16).eval()
    separate, fused = copy.deepcopy(base), copy.deepcopy(base)
    pack_separately(separate, monkeypatch)
    assert packing.fuse_siblings(fused, threads=2) > 0
    packing.pack_linears(fused)
    mlp = fused.model.layers[0].mlp
    assert isinstance(mlp.forward, packing.SerialGatedMLP)   # silu and product in row chunks, one thread
    ids = torch.randint(0, base.config.vocab_size, (3, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        assert torch.equal(fused(ids).logits, separate(ids).logits)
        assert torch.equal(fused(ids).logits, base(ids).logits)   # and the model with plain nn.Linear
        long = torch.randint(0, base.config.vocab_size, (1, 300), generator=torch.Generator().manual_seed(2))
        assert torch.equal(fused(long).logits, separate(long).logits)   # several row chunks
        assert torch.equal(fused(long).logits, base(long).logits)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
def test_packed_and_fused_linears_give_the_numbers_of_plain_nn_linear(bias, dtype):
    # NOTE: the other tests compare packed with packed; this one holds the packed model to the plain one: bit for
    # bit in bf16, within fp32 rounding in fp32 (MKL, behind plain F.linear, sums in another order than oneDNN)
    torch.manual_seed(0)
    plain = torch.nn.Sequential(Block(bias), Block(bias)).to(dtype)
    packed = copy.deepcopy(plain)
    assert packing.fuse_siblings(packed, threads=2, dtype=dtype) == 4
    assert packing.pack_linears(packed, dtype=dtype) == 2   # the down_proj of each block
    assert isinstance(packed[0].down_proj, packing.PackedLinear) and isinstance(packed[1].v_proj, packing.FusedPart)
    with torch.inference_mode():
        for rows in (1, 5, 32, 70):
            x = torch.randn(1, rows, 64).to(dtype)
            if dtype == torch.bfloat16:
                assert torch.equal(packed(x), plain(x)), rows
            else:
                torch.testing.assert_close(packed(x), plain(x), rtol=1e-5, atol=1e-5)


class GatedMLP(torch.nn.Module):
    def __init__(self, act) -> None:
        super().__init__()
        self.act = act
        self.gate_proj = torch.nn.Linear(64, 96, bias=False)
        self.up_proj = torch.nn.Linear(64, 96, bias=False)
        self.down_proj = torch.nn.Linear(96, 64, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


@pytest.mark.skipif(not packing.can_pack(torch.bfloat16), reason="oneDNN cannot pack bf16 weights on this CPU")
@pytest.mark.parametrize("act, serial", [(torch.nn.functional.gelu, False), (torch.nn.functional.silu, True)])
def test_serial_mlp_only_where_it_gives_the_same_numbers(act, serial):
    torch.manual_seed(0)
    plain = GatedMLP(act).to(torch.bfloat16)
    model = copy.deepcopy(plain)
    assert packing.fuse_siblings(model, threads=2) == 1
    # a GELU-gated MLP keeps its own forward; a SiLU-gated one runs the serial form
    assert isinstance(model.__dict__.get("forward"), packing.SerialGatedMLP) is serial
    with torch.inference_mode():
        for rows in (1, 7, 700):   # 700 rows: several row chunks of the serial form (341 rows each)
            x = torch.randn(1, rows, 64).to(torch.bfloat16)
            assert torch.equal(model(x), plain(x)), rows


def test_fp32_linears_are_packed_only_in_a_model_past_the_size_threshold():
    """pack_fp32_linears leaves small fp32 models (the tests' references) to F.linear, and packs a large one, whose
    outputs then stay within fp32 rounding of F.linear's."""
    torch.manual_seed(0)
    small = torch.nn.Sequential(Block(False))
    assert packing.pack_fp32_linears(small) == 0 and type(small[0].down_proj) is torch.nn.Linear
    side = 4096   # one 4,096 x 4,096 linear: 16.8M weights, past FP32_MIN_WEIGHTS
    plain = torch.nn.Sequential(torch.nn.Linear(side, side, bias=False))
    large = copy.deepcopy(plain)
    assert packing.pack_fp32_linears(large) == 1 and isinstance(large[0], packing.PackedLinear)
    with torch.inference_mode():
        x = torch.randn(1, 5, side)
        torch.testing.assert_close(large(x), plain(x), rtol=1e-4, atol=1e-4)
