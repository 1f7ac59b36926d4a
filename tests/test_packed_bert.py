"""The encoder runner's packed BERT forward (plugins/pooling/packed_bert.py, attention and residual LayerNorm in C):
on prompts of different lengths laid back to back with no padding, every row equals transformers' BertModel on the
same prompts padded and masked, in fp32; in bf16 the pooled vectors stay as close to fp32's as transformers' own bf16
forward; the runner takes this path for a BERT and keeps transformers' modules for a cross-encoder."""
from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertModel, BertForSequenceClassification

from modelcall.core import KernelConfig
from modelcall.plugins.pooling import encoder_ops, packed_bert
from modelcall.plugins.pooling.encoder import EncoderRunner

LENGTHS = [1, 5, 64, 17, 130, 33]   # 1 and 130: a lone token, and a sequence past 128 keys (three 64-row halves)


def tiny_bert(hidden: int, heads: int, dtype: torch.dtype = torch.float32) -> BertModel:
    torch.manual_seed(0)
    # NOTE: 0.3, not the default 0.02: a random encoder's attention is then far from uniform, so a key from another
    # sequence or a missing scale moves each row's state visibly
    config = BertConfig(vocab_size=200, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=heads,
                        intermediate_size=2 * hidden, max_position_embeddings=256, initializer_range=0.3)
    return BertModel(config).to(dtype).eval()


def packed_rows(model: BertModel, ids: list[torch.Tensor]) -> list[torch.Tensor]:
    lengths = [len(x) for x in ids]
    flat = torch.cat(ids)
    cu = torch.tensor([0, *lengths]).cumsum(0)
    out = packed_bert.build(model).forward(flat, torch.cat([torch.arange(n) for n in lengths]), torch.zeros_like(flat), cu)
    return [out[cu[b]:cu[b + 1]].float() for b in range(len(ids))]


def padded_rows(model: BertModel, ids: list[torch.Tensor]) -> list[torch.Tensor]:
    width = max(len(x) for x in ids)
    batch = torch.zeros((len(ids), width), dtype=torch.long)
    mask = torch.zeros_like(batch)
    for b, x in enumerate(ids):
        batch[b, :len(x)], mask[b, :len(x)] = x, 1
    with torch.inference_mode():
        hidden = model(input_ids=batch, attention_mask=mask).last_hidden_state.float()
    return [hidden[b, :len(x)] for b, x in enumerate(ids)]


def prompts(lengths: list[int]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(1, 200, (n,), generator=g) for n in lengths]


@pytest.mark.parametrize("hidden,heads", [(64, 4), (48, 4)], ids=["head_dim16-avx512", "head_dim12-portable"])
def test_packed_rows_equal_transformers_padded_and_masked_in_fp32(hidden, heads):
    model = tiny_bert(hidden, heads)
    ids = prompts(LENGTHS)
    for ours, want in zip(packed_rows(model, ids), padded_rows(model, ids)):
        assert ours.shape == want.shape
        assert (ours - want).abs().max().item() < 2e-5


def test_each_sequence_attends_only_to_its_own_rows():
    """The same prompt packed beside different neighbours (or alone) gets the same rows."""
    model = tiny_bert(64, 4)
    a, b, c = prompts([20, 45, 7])
    alone = packed_rows(model, [a])[0]
    assert torch.allclose(packed_rows(model, [b, a, c])[1], alone, atol=2e-5)
    assert torch.allclose(packed_rows(model, [c, c, a])[2], alone, atol=2e-5)


def test_bf16_stays_as_close_to_fp32_as_transformers_own_bf16():
    fp32, bf16 = tiny_bert(64, 4), tiny_bert(64, 4, torch.bfloat16)
    ids = prompts(LENGTHS)
    want = torch.stack([r.mean(0) for r in padded_rows(fp32, ids)])
    theirs = torch.stack([r.mean(0) for r in padded_rows(bf16, ids)])
    ours = torch.stack([r.mean(0) for r in packed_rows(bf16, ids)])
    cos = torch.nn.functional.cosine_similarity
    # NOTE: measured on this model: worst 1 - cosine 6.3e-5 (ours), 4.7e-5 (transformers bf16); per input they
    # differ by rounding luck, so the bound is the worst error within twice transformers' own
    assert (1 - cos(ours, want)).max() <= 2 * (1 - cos(theirs, want)).max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_layernorm_in_place_writes_the_residual_it_would_have_returned(dtype):
    g = torch.Generator().manual_seed(2)
    x, res = torch.randn(37, 48, generator=g).to(dtype), torch.randn(37, 48, generator=g)
    w, b = torch.randn(48, generator=g), torch.randn(48, generator=g)
    want = torch.nn.functional.layer_norm(x.float() + res, (48,), w, b, 1e-12)
    out, fresh = encoder_ops.add_layernorm(x, res.clone(), w, b, 1e-12)
    stream = res.clone()
    out2, same = encoder_ops.add_layernorm(x, stream, w, b, 1e-12, in_place=True)
    assert same.data_ptr() == stream.data_ptr()   # no new residual tensor
    assert torch.equal(same, fresh) and torch.equal(out2, out)
    assert torch.allclose(fresh, want, atol=1e-5)


def test_varlen_attention_refuses_offsets_that_do_not_cover_the_rows():
    qkv = torch.zeros((10, 3 * 32))
    with pytest.raises(ValueError, match="cu_seqlens"):
        encoder_ops.varlen_attention(qkv, torch.tensor([0, 4, 9]), 2, 1.0)


def test_the_runner_packs_a_bert_and_keeps_transformers_for_a_cross_encoder(tmp_path):
    tiny_bert(64, 4).save_pretrained(tmp_path / "bert")
    BertForSequenceClassification(tiny_bert(64, 4).config).save_pretrained(tmp_path / "scorer")
    config = KernelConfig(model=str(tmp_path / "bert"), device="cpu", dtype="float32")
    assert EncoderRunner(config, str(tmp_path / "bert")).packed is not None
    assert EncoderRunner(config, str(tmp_path / "scorer")).packed is None
    assert packed_bert.build(tiny_bert(64, 4, torch.float16)) is None   # the C ops take bf16 and fp32 only
