"""Gemma 3's decoder as one loop over its layers, the lean stack's way (lean.py), for fp32 runners on CPU.

transformers' Gemma3DecoderLayer is four RMSNorms of `x * rsqrt(mean(x^2) + eps) * (1 + w)` (input, after
attention, before and after the MLP), q/k norms before the rotary, two rotary tables (sliding layers' local base,
full layers' global one), GELU-tanh, and a scaled embedding: about 60 small torch ops a layer. At one stream on
the Gemma 3 270M GGUF they were a third of the decode step beside the quantized matmuls (py-spy, issue 38). Here
one layer is

    x ─ qkv ─ rope (+ q/k norm, its layer type's table) ─ paged_attention ─ o ─ norm ─┐
    h ──────────────────────────────────────────────────────────────── add_rmsnorm ┴─ x ─ gate/up ─ gelu_tanh_mul
      ─ down ─ norm ─ add_rmsnorm (h += it; x = next layer's input norm, or the final norm)

with the norms' `1 + w` folded into their weights once (fp32: the same product), the quantized linears fused as
lean.py fuses them, and attention through attention.paged_attention with the layer's window, exactly as the HF
module calls it. fp32 only: in bf16 Gemma rounds after the weight product, the fused ops before it.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from modelcall.plugins.runner import attention, cpu_kernel, decode_stack, fused_ops, huge_pages, lean, plain_decode
from modelcall.plugins.runner.batch import StepBatch

log = logging.getLogger("modelcall.runner")

FAMILIES = ("gemma3_text",)
LAYER_PARTS = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
               "post_feedforward_layernorm"}


@dataclass(slots=True)
class GemmaLayer(lean.Layer):
    """lean.Layer (norm1: input, norm2: after attention, q/k norms: all as 1 + w) with Gemma's other two norms."""
    pre_ff: torch.Tensor | None = None
    post_ff: torch.Tensor | None = None
    table: str = "full_attention"   # the rotary table of the layer's type


def _unit(norm: torch.nn.Module) -> torch.Tensor:
    """Gemma3RMSNorm's effective weight, 1 + w, in fp32 (its forward adds them in fp32 per call)."""
    return (1.0 + norm.weight.detach().float()).contiguous()


class GemmaStack:
    """The decoder of a Gemma 3 text model as one loop over its layers (see the module docstring)."""

    def __init__(self, base: torch.nn.Module, layers: list[GemmaLayer], eps: float,
                 heads: tuple[int, int, int]) -> None:
        self.lookup = base.embed_tokens   # the module itself: it scales the rows by sqrt(hidden)
        self.rotary = base.rotary_emb
        self.final_norm = _unit(base.norm)
        self.layers = layers
        self.eps = eps
        self.num_q, self.num_kv, self.head_dim = heads
        self.tables: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.positions = 0
        self.act_mul = "gelu_tanh_mul"   # fused_ops' name (the decode stack calls it too)
        self.plain: plain_decode.DecodeAttention | None = None   # set by build()
        self.cstack: decode_stack.DecodeStack | None = None      # set by build()
        self.rehomed: huge_pages.Rehomed | None = None            # set by build()

    def rope_table(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The cos/sin table of `layer`'s type (plain_decode reads it)."""
        return self.tables[self.layers[layer].table]

    def _rope_tables(self, positions: int) -> None:
        """cos/sin rows for positions 0..n-1 (n a power of two >= `positions`) per layer type, as the HF rotary
        module computes them for a forward."""
        n = 1 << max(positions - 1, 1).bit_length()
        like = self.final_norm
        ids = torch.arange(n, device=like.device).unsqueeze(0)
        for kind in {L.table for L in self.layers}:
            cos, sin = self.rotary(like[:1].view(1, 1, 1), ids, kind)
            self.tables[kind] = (cos[0].contiguous(), sin[0].contiguous())
        self.positions = n

    def forward(self, step: StepBatch) -> torch.Tensor:
        """The final-normed hidden states [T, hidden] of `step` (its K/V written), as the HF model's forward."""
        ids, pos = step.input_ids[0], step.positions[0]
        top = int(pos.max()) + 1
        if top > self.positions:
            self._rope_tables(top)
        h = self.lookup(ids)   # a new tensor: the residual stream, updated in place
        tokens = h.shape[0]
        x, t = torch.empty_like(h), torch.empty_like(h)
        eps, nq, nkv, d = self.eps, self.num_q, self.num_kv, self.head_dim
        fused_ops.add_rmsnorm(None, h, x, self.layers[0].norm1, eps)
        last = len(self.layers) - 1
        heads = (nq, nkv, nkv)
        act: torch.Tensor | None = None
        plain = (self.plain if self.plain is not None and self.plain.prepare(step, pos, tokens, h.dtype) else None)
        if (plain is not None and step.lora is None and self.cstack is not None
                and tokens <= self.cstack.max_tokens(h.dtype)):
            self.cstack.run(h, x)   # every layer in one C call: the loop below, over quantized weights
            return x
        for i, L in enumerate(self.layers):
            qkv = L.qkv(x)
            if plain is not None:   # rope, K/V write and attention in one C call (plain_decode.py)
                o = plain.attend(i, qkv)
            else:
                cos, sin = self.tables[L.table]
                fused_ops.rope(qkv, pos, cos, sin, nq, nkv, d, L.q_norm, L.k_norm, eps)
                q, k, v = qkv.view(1, tokens, nq + 2 * nkv, d).transpose(1, 2).split(heads, 1)
                o, _ = attention.paged_attention(L.attn, q, k, v, None, scaling=L.scale, sliding_window=L.window,
                                                 modelcall_step=step)
            fused_ops.add_rmsnorm(None, L.o(o.reshape(tokens, nq * d)), t, L.norm2, eps)   # t = norm(o(attn))
            fused_ops.add_rmsnorm(t, h, x, L.pre_ff, eps)                                 # h += t; x = norm(h)
            gate, up = L.gate_and_up(x)
            if act is None:
                act = gate.new_empty(gate.shape)
            fused_ops.gelu_tanh_mul(gate, up, act)
            fused_ops.add_rmsnorm(None, L.down(act), t, L.post_ff, eps)
            nxt = self.final_norm if i == last else self.layers[i + 1].norm1
            fused_ops.add_rmsnorm(t, h, x, nxt, eps)
        return x


def build(base: torch.nn.Module, hf_config: Any, windows: tuple[int, ...], mode: Any, plain: Any = "auto",
          cstack: Any = "auto", huge: Any = True) -> GemmaStack | None:
    """The Gemma stack for `base` when `mode` and the model allow it (fp32 on CPU; "auto": quantized linears),
    else None (transformers' modules run)."""
    norm = getattr(base, "norm", None)
    if norm is None or norm.weight.device.type != "cpu" or norm.weight.dtype != torch.float32:
        return None
    if mode == "auto" and not lean._quantized(base):
        return None
    if fused_ops.load() is None:
        return None
    why = _unsupported(base, hf_config)
    if why:
        log.info("lean decoder not used for gemma3: %s", why)
        return None
    layers = []
    projections: list[tuple[Any, ...]] | None = []   # each layer's quantized weights, for the decode stack
    for i, layer in enumerate(base.layers):
        attn, mlp = layer.self_attn, layer.mlp
        lin = lean.layer_linears(attn, mlp)
        if lin is None:
            log.info("lean decoder not used: layer %d's linears are not packed the expected way", i)
            return None
        if projections is not None:
            four = lean.quant_parts(attn, mlp, *lin)
            projections = None if four is None else projections + [four]
        layers.append(GemmaLayer(attn, *lin, _unit(layer.input_layernorm),
                                 _unit(layer.post_attention_layernorm), _unit(attn.q_norm), _unit(attn.k_norm),
                                 float(attn.scaling), windows[i] or None, pre_ff=_unit(layer.pre_feedforward_layernorm),
                                 post_ff=_unit(layer.post_feedforward_layernorm), table=attn.layer_type))
    stack = GemmaStack(base, layers, float(base.norm.eps), (int(hf_config.num_attention_heads),
                                                            int(hf_config.num_key_value_heads), int(attn.head_dim)))
    stack.rehomed = lean.rehome_weights([base], layers, huge)   # type: ignore[arg-type]
    if plain not in (False, "off", "false") and cpu_kernel.load() is not None:
        stack.plain = plain_decode.DecodeAttention(stack)   # type: ignore[arg-type]
    if cstack not in (False, "off", "false"):
        stack.cstack = decode_stack.DecodeStack.build(stack, projections)   # type: ignore[arg-type]
    lean.heap.release_free_memory()   # the fused weights' old blocks (lean._fused_quant)
    log.info("lean decoder stack: %d gemma3 layers (float32; plain decode steps in one call per layer: %s, all "
             "layers in one call: %s)", len(layers), stack.plain is not None, stack.cstack is not None)
    return stack


def _unsupported(base: torch.nn.Module, hf_config: Any) -> str | None:
    if getattr(hf_config, "hidden_activation", None) != "gelu_pytorch_tanh":
        return f"activation {getattr(hf_config, 'hidden_activation', None)}"
    if getattr(hf_config, "attn_logit_softcapping", None):
        return "attention logit softcapping"
    if getattr(hf_config, "use_bidirectional_attention", False):
        return "bidirectional attention"
    rope = getattr(hf_config, "rope_parameters", None) or {}
    for kind, params in rope.items():
        if (params or {}).get("rope_type", "default") not in lean.STATIC_ROPE:
            return f"{kind} rope type {params.get('rope_type')} (cos/sin depend on more than the position)"
    if not all(hasattr(base, n) for n in ("embed_tokens", "rotary_emb", "norm", "layers")):
        return "not the embed/rotary/layers/norm model layout"
    eps = {float(base.norm.eps)}
    for layer in base.layers:
        if set(dict(layer.named_children())) != LAYER_PARTS:
            return f"a layer of other parts: {sorted(dict(layer.named_children()))}"
        if set(dict(layer.mlp.named_children())) - {"gate_proj", "up_proj", "down_proj", "act_fn"}:
            return "an MLP of another kind"
        attn = layer.self_attn
        norms = [getattr(layer, n) for n in LAYER_PARTS if n.endswith("layernorm")] + [attn.q_norm, attn.k_norm]
        if any(type(n).__name__ != "Gemma3RMSNorm" for n in norms):
            return "a norm of another kind"
        eps |= {float(n.eps) for n in norms}
        if getattr(attn, "layer_type", None) not in rope:
            return f"layer type {getattr(attn, 'layer_type', None)!r} without its rotary parameters"
    if len(eps) != 1:
        return "norms with different eps"
    return None
