"""PackedBert: a BERT encoder's forward on packed rows: the prompts of a step laid back to back ([tokens, hidden],
no padding), every GEMM on real tokens only, attention per sequence in C (encoder_ops.varlen_attention).

Per layer: one QKV GEMM (the three projections' weights stacked), attention, the output GEMM, residual + LayerNorm
(C, one pass), the intermediate GEMM with GELU as oneDNN's post-op, the output GEMM, residual + LayerNorm; five
native calls in place of transformers' ~20 ops. The weights are transformers' BertModel's, packed into oneDNN's
layout once. The arithmetic is the module's (erf GELU) but for the residual stream, kept in fp32 in a bf16 model
(transformers rounds it to bf16 at every sublayer); fp32 rows agree with the module within 2e-5.
"""
from __future__ import annotations

import torch

from modelcall.plugins.pooling import cpu_gemm, encoder_ops


def build(model: torch.nn.Module) -> PackedBert | None:
    """A PackedBert of transformers' `BertModel` on the CPU, or None where this forward would not be the model's
    (another architecture or activation, a decoder, a dtype but bf16 or fp32, a torch without oneDNN) or the C library
    cannot be built."""
    config = getattr(model, "config", None)
    if (type(model).__name__ != "BertModel" or config is None or getattr(config, "hidden_act", None) != "gelu"
            or getattr(config, "is_decoder", False) or getattr(config, "position_embedding_type", "absolute") != "absolute"
            or next(model.parameters()).device.type != "cpu"
            or next(model.parameters()).dtype not in (torch.bfloat16, torch.float32)
            or not cpu_gemm.packing_agrees(next(model.parameters()).dtype) or encoder_ops.load() is None):
        return None
    return PackedBert(model)


class _Layer:
    """One BertLayer's weights: linears packed, norms as (weight, bias, eps)."""

    def __init__(self, layer: torch.nn.Module) -> None:
        att, out = layer.attention, layer.output
        s = att.self
        self.qkv = _Packed(torch.cat([s.query.weight, s.key.weight, s.value.weight]),
                           torch.cat([s.query.bias, s.key.bias, s.value.bias]))
        self.attn_out = _Packed(att.output.dense.weight, att.output.dense.bias)
        self.attn_norm = _norm(att.output.LayerNorm)
        self.up = _Packed(layer.intermediate.dense.weight, layer.intermediate.dense.bias, post="gelu")
        self.down = _Packed(out.dense.weight, out.dense.bias)
        self.out_norm = _norm(out.LayerNorm)


class _Packed:
    """A linear's weight in oneDNN's blocked layout; `post` a oneDNN post-op fused into the GEMM (GELU: erf)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, post: str = "none") -> None:
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), cpu_gemm.ROWS_HINT)
        self.bias = bias.detach().contiguous()
        self.post, self.algorithm = post, ("none" if post == "gelu" else "")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, self.post, [], self.algorithm)


def _norm(ln: torch.nn.LayerNorm) -> tuple[torch.Tensor, torch.Tensor, float]:
    return ln.weight.detach().float().contiguous(), ln.bias.detach().float().contiguous(), float(ln.eps)


class PackedBert:
    """`forward(ids, positions, token_types, cu_seqlens)`: the final hidden state of every packed row."""

    def __init__(self, model: torch.nn.Module) -> None:
        emb = model.embeddings
        self.word = emb.word_embeddings.weight.detach()
        self.position = emb.position_embeddings.weight.detach()
        self.token_type = emb.token_type_embeddings.weight.detach()
        self.emb_norm = _norm(emb.LayerNorm)
        self.heads = int(model.config.num_attention_heads)
        self.scale = (int(model.config.hidden_size) // self.heads) ** -0.5
        with torch.inference_mode():
            self.layers = [_Layer(layer) for layer in model.encoder.layer]

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, token_types: torch.Tensor,
                cu_seqlens: torch.Tensor) -> torch.Tensor:
        """ids, positions, token_types: [tokens] int64 (positions count from 0 in each sequence); cu_seqlens: the
        sequences' int64 row offsets, num_seqs + 1 of them. Returns [tokens, hidden] fp32."""
        with torch.inference_mode():
            # NOTE: the residual stream (res) in fp32 from the embeddings on; only the GEMMs' inputs (x) are in the
            # model's dtype. In bf16 that is one rounding per sublayer fewer than transformers' modules make.
            res = (self.word[ids].float() + self.token_type[token_types].float()) + self.position[positions].float()
            res = torch.nn.functional.layer_norm(res, res.shape[-1:], *self.emb_norm)
            x = res.to(self.word.dtype)
            for layer in self.layers:
                ctx = encoder_ops.varlen_attention(layer.qkv(x), cu_seqlens, self.heads, self.scale)
                x, res = encoder_ops.add_layernorm(layer.attn_out(ctx), res, *layer.attn_norm, in_place=True)
                x, res = encoder_ops.add_layernorm(layer.down(layer.up(x)), res, *layer.out_norm, in_place=True)
        return res
