"""bf16 CPU linears: pre-packed weights and fused sibling GEMMs (q/k/v, gate/up) give the same numbers."""
import copy

import pytest
import torch

from modelcall.plugins.runner import packing

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch build")


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


def pack_separately(model, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(packing, "fuse_siblings", lambda *a, **k: 0)
        packing.pack_linears(model)
    assert isinstance(model.get_submodule(next(n for n, _ in model.named_modules() if n.endswith("k_proj"))),
                      packing.PackedLinear)


@pytest.mark.parametrize("bias", [False, True])
def test_fused_siblings_equal_separate_packed_linears(bias, monkeypatch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(bias), Block(bias)).to(torch.bfloat16)
    separate, fused = copy.deepcopy(model), copy.deepcopy(model)
    pack_separately(separate, monkeypatch)
    assert packing.fuse_siblings(fused, threads=2) == 4
    packing.pack_linears(fused)
    assert isinstance(fused[0].k_proj, packing.FusedPart) and isinstance(fused[1].up_proj, packing.FusedPart)
    assert isinstance(fused[0].down_proj, packing.PackedLinear)
    with torch.inference_mode():
        for rows in (1, 5, 32, 70):
            x = torch.randn(1, rows, 64).to(torch.bfloat16)
            assert torch.equal(fused(x), separate(x))
            assert fused[0].q_proj.fused._x is None   # nothing held once every sibling read its slice


def test_gate_up_stay_separate_on_one_thread():
    model = Block(False).to(torch.bfloat16)
    assert packing.fuse_siblings(model, threads=1) == 1
    assert isinstance(model.q_proj, packing.FusedPart) and type(model.gate_proj) is torch.nn.Linear


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


@pytest.mark.parametrize("bias", [False, True])
def test_packed_and_fused_linears_give_the_numbers_of_plain_nn_linear(bias):
    # NOTE: the other tests compare packed with packed; this one holds the packed model to the plain one.
    torch.manual_seed(0)
    plain = torch.nn.Sequential(Block(bias), Block(bias)).to(torch.bfloat16)
    packed = copy.deepcopy(plain)
    assert packing.fuse_siblings(packed, threads=2) == 4
    assert packing.pack_linears(packed) == 2   # the down_proj of each block
    assert isinstance(packed[0].down_proj, packing.PackedLinear) and isinstance(packed[1].v_proj, packing.FusedPart)
    with torch.inference_mode():
        for rows in (1, 5, 32, 70):
            x = torch.randn(1, rows, 64).to(torch.bfloat16)
            assert torch.equal(packed(x), plain(x)), rows


class GatedMLP(torch.nn.Module):
    def __init__(self, act) -> None:
        super().__init__()
        self.act = act
        self.gate_proj = torch.nn.Linear(64, 96, bias=False)
        self.up_proj = torch.nn.Linear(64, 96, bias=False)
        self.down_proj = torch.nn.Linear(96, 64, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


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
