"""modelcall's own decoder stack for Llama-like families on CPU: the HF model's weights, fewer dispatches.

transformers' decoder layer costs ~45 small torch ops and several nn.Module calls per layer (RMSNorm's fp32
round trip, rotary's slices and cats, residual adds, dtype casts); at W1's decode step (batch 32, 8 layers)
that was ~6 ms of a 32.5 ms step. Here one layer is

    x ─ qkv GEMM ─ rope (in place, + q/k norm) ─ paged_attention ─ o GEMM ─┐
    h ──────────────────────────────────────────────────────── add_rmsnorm ┴─ x ─ gate/up GEMM(s) ─ silu_mul
      ─ down GEMM ─ add_rmsnorm (h += down; x = next layer's input norm, or the final norm)

with the packed GEMMs of packing.py, the fused ops of fused_ops.py, the cos/sin table built once (rows picked
per token inside `rope`), and attention through attention.paged_attention exactly as the HF modules call it.
In fp32 with packed linears the o and down GEMMs make the residual add themselves (a oneDNN post-op:
`_epilogues`), and add_rmsnorm then only normalizes. In a step of decodes and short chunks (no fresh prompt), rope,
the K/V write and attention are one C call per layer (plain_decode.py).

Taken for the families in FAMILIES whose modules have the shapes read below, and for Gemma 3 (lean_gemma.py: its
layer has four norms, GELU and two rotary tables), else transformers' modules run, as for every other family.
`runner.lean` in the plugin config: "auto" (default: bf16 on CPU, and fp32 when the runner packed the linears:
`_packed_fp32`), true (any fp32 too: the parity tests), false (never).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from modelcall.plugins.runner import (attention, cpu_kernel, decode_stack, fused_ops, heap, huge_pages, packing,
                                      plain_decode, quant)
from modelcall.plugins.runner.batch import StepBatch

log = logging.getLogger("modelcall.runner")

# model_type -> its RMSNorm class name: weight * (x * rsqrt(mean(x^2) + eps)).to(dtype), weight multiplied last
FAMILIES = {"llama": "LlamaRMSNorm", "mistral": "MistralRMSNorm", "qwen2": "Qwen2RMSNorm", "qwen3": "Qwen3RMSNorm"}
STATIC_ROPE = ("default", "linear", "llama3", "yarn")   # cos/sin depend on the position only

Linear = Callable[[torch.Tensor], torch.Tensor]


@dataclass(slots=True)
class Layer:
    attn: torch.nn.Module          # the HF attention module: attention.paged_attention reads its layer_idx
    qkv: Linear                    # x -> [T, (Hq + 2 Hkv) * D]
    o: Linear
    gate_up: Linear | None         # one GEMM, gate columns first (else gate and up apart)
    gate: Linear | None
    up: Linear | None
    down: Linear
    norm1: torch.Tensor            # input_layernorm weight
    norm2: torch.Tensor            # post_attention_layernorm weight
    q_norm: torch.Tensor | None    # Qwen3's per-head norms
    k_norm: torch.Tensor | None
    scale: float
    window: int | None
    # fp32 with packed linears (see _epilogues): the residual adds inside the GEMMs as oneDNN post-ops
    o_add: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None      # (a, h) -> h + o(a)
    down_add: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None   # (a, h) -> h + down(a)

    def gate_and_up(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """gate(x), up(x): the two halves of one GEMM's result when they are fused."""
        if self.gate_up is not None:
            gate, up = self.gate_up(x).chunk(2, 1)
            return gate, up
        assert self.gate is not None and self.up is not None
        return self.gate(x), self.up(x)


def _linear(mod: Any) -> Linear | None:
    if isinstance(mod, quant.QuantLinear):   # GGUF or --quantization weights: the quantized kernels
        return mod.forward   # qmatmul for few tokens, a dequantized tile's GEMM for many (quant.QuantLinear)
    if isinstance(mod, packing.PackedLinear):
        packed, bias = mod.packed, mod.bias
        return lambda x: packing.gemm(x, packed, bias)   # module attribute: benchmarks wrap packing.gemm
    if type(mod) is torch.nn.Linear:
        weight, bias = mod.weight, mod.bias
        return lambda x: F.linear(x, weight, bias)
    return None


def _fused(parts: list[Any]) -> Linear | None:
    """One GEMM for sibling linears: their packing.FusedLinears when they are its parts in order, else (plain
    nn.Linear, fp32) their weights concatenated; quantized ones as one quantized weight (rows concatenated) when
    they share a block type, else each into its columns of one output."""
    if all(isinstance(p, quant.QuantLinear) for p in parts):
        return _fused_quant(parts)
    if all(isinstance(p, packing.FusedPart) for p in parts):
        fused = parts[0].fused
        if all(p.fused is fused and p.index == i for i, p in enumerate(parts)) and len(fused.bounds) == len(parts):
            packed, bias = fused.packed, fused.bias
            return lambda x: packing.gemm(x, packed, bias)
        return None
    if all(type(p) is torch.nn.Linear for p in parts) and len({p.bias is None for p in parts}) == 1:
        weight = torch.cat([p.weight for p in parts])
        bias = torch.cat([p.bias for p in parts]) if parts[0].bias is not None else None
        return lambda x: F.linear(x, weight, bias)
    return None


def _fused_quant(parts: list[Any]) -> Linear | None:
    if len({p.qweight.shape[1] for p in parts}) != 1 or len({p.bias is None for p in parts}) != 1 or len(
            {p.int8 for p in parts}) != 1:
        return None
    bias = torch.cat([p.bias for p in parts]) if parts[0].bias is not None else None
    if len({p.qweight.qtype for p in parts}) == 1:   # rows are independent: concatenated blocks are one weight
        k = parts[0].qweight.shape[1]
        data = torch.cat([p.qweight.data for p in parts])
        at = 0
        for p in parts:   # NOTE: each part's weight becomes a view of its rows of the fused one, so the model holds
            rows = p.qweight.data.shape[0]   # one copy (Gemma 3's resident memory bar); the old blocks are freed
            p.qweight = quant.QWeight(data[at:at + rows], p.qweight.qtype, p.qweight.shape)
            at += rows
        qw = quant.qweight_from_bytes(data, parts[0].qweight.qtype, sum(p.qweight.shape[0] for p in parts), k)
        return quant.QuantLinear(qw, bias, int8=parts[0].int8).forward
    bounds, at = [], 0
    for p in parts:
        bounds.append((p.qweight, at, at + p.qweight.shape[0]))
        at += p.qweight.shape[0]

    def run(x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > min(quant.dense_from_tokens(x.dtype, qw.qtype) for qw, _, _ in bounds):   # prefill: each
            # part's dequantized GEMM
            return torch.cat([p.forward(x) for p in parts], -1)   # each part adds its own bias
        out = x.new_empty(x.shape[0], at)
        for qw, a, b in bounds:   # each part writes its own columns (a row stride of `at`)
            quant.qmatmul(x, qw, None, out=out[:, a:b], int8=parts[0].int8)
        return out if bias is None else out.add_(bias)
    return run


class LeanStack:
    """The decoder of a Llama-like model as one loop over its layers (see the module docstring)."""

    def __init__(self, base: torch.nn.Module, layers: list[Layer], eps: float, heads: tuple[int, int, int]) -> None:
        embed = base.embed_tokens
        # token ids -> rows: the table itself, or a quantized table's lookup (gguf_weights.QuantEmbedding)
        self.lookup: Callable[[torch.Tensor], torch.Tensor] = (
            (lambda ids, w=embed.weight: F.embedding(ids, w)) if isinstance(embed, torch.nn.Embedding) else embed)
        self.rotary = base.rotary_emb
        self.final_norm = base.norm.weight
        self.layers = layers
        self.eps = eps
        self.num_q, self.num_kv, self.head_dim = heads
        self.cos = self.sin = self.final_norm.new_empty(0, self.head_dim)
        self.act_mul = "silu_mul"   # fused_ops' activation-times-up, by name (the decode stack calls it too)
        self.rehomed: huge_pages.Rehomed | None = None   # set by build(): the weights moved onto 2 MiB pages
        self.plain: plain_decode.DecodeAttention | None = None   # set by build() (plain_decode.py)
        self.cstack: decode_stack.DecodeStack | None = None      # set by build() (decode_stack.py)

    def _rope_table(self, positions: int) -> None:
        """cos/sin rows for positions 0..n-1 (n a power of two >= `positions`), as the HF rotary module
        computes them for a forward (per position, in the model's dtype)."""
        n = 1 << max(positions - 1, 1).bit_length()
        like = self.final_norm
        ids = torch.arange(n, device=like.device).unsqueeze(0)
        cos, sin = self.rotary(like[:1].view(1, 1, 1), position_ids=ids)
        self.cos, self.sin = cos[0].contiguous(), sin[0].contiguous()

    def rope_table(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The cos/sin table `layer` rotates by (one for every layer here)."""
        return self.cos, self.sin

    def forward(self, step: StepBatch) -> torch.Tensor:
        """The final-normed hidden states [T, hidden] of `step` (its K/V written), as the HF model's forward."""
        ids, pos = step.input_ids[0], step.positions[0]
        top = int(pos.max()) + 1
        if top > self.cos.shape[0]:
            self._rope_table(top)
        h = self.lookup(ids)   # the residual stream: updated in place, or replaced by a GEMM's h + out
        tokens = h.shape[0]
        x = torch.empty_like(h)
        eps, nq, nkv, d = self.eps, self.num_q, self.num_kv, self.head_dim
        fused_ops.add_rmsnorm(None, h, x, self.layers[0].norm1, eps)
        last = len(self.layers) - 1
        heads = (nq, nkv, nkv)
        # NOTE: a step with LoRA rows (step.lora) never takes the all-layers C stack, which runs every projection in C,
        # past the adapters' deltas (plugins/runner/lora_runner.py); the one-call attention reads q|k|v after them
        plain = (self.plain if self.plain is not None and self.plain.prepare(step, pos, tokens, h.dtype) else None)
        if (plain is not None and step.lora is None and self.cstack is not None
                and tokens <= self.cstack.max_tokens(h.dtype)):
            self.cstack.run(h, x)   # every layer in one C call: the loop below, over quantized weights
            return x
        act: torch.Tensor | None = None   # silu(gate) * up, one buffer for every layer (down reads it before the next)
        for i, L in enumerate(self.layers):
            qkv = L.qkv(x)
            if plain is not None:   # rope, K/V write and attention in one C call
                o = plain.attend(i, qkv)
            else:
                fused_ops.rope(qkv, pos, self.cos, self.sin, nq, nkv, d, L.q_norm, L.k_norm, eps)
                # [1, H, T, D] views of the packed rows, as the HF modules pass them: one view, then split by heads
                q, k, v = qkv.view(1, tokens, nq + 2 * nkv, d).transpose(1, 2).split(heads, 1)
                o, _ = attention.paged_attention(L.attn, q, k, v, None, scaling=L.scale, sliding_window=L.window,
                                                 modelcall_step=step)
            if L.o_add is not None:   # h + o(attn) stored by the GEMM itself: a new residual tensor
                h = L.o_add(o.reshape(tokens, nq * d), h)
                fused_ops.add_rmsnorm(None, h, x, L.norm2, eps)
            else:
                fused_ops.add_rmsnorm(L.o(o.reshape(tokens, nq * d)), h, x, L.norm2, eps)
            nxt = self.final_norm if i == last else self.layers[i + 1].norm1
            gate, up = L.gate_and_up(x)
            if act is None:
                act = gate.new_empty(gate.shape)
            fused_ops.silu_mul(gate, up, act)
            if L.down_add is not None:
                h = L.down_add(act, h)
                fused_ops.add_rmsnorm(None, h, x, nxt, eps)
            else:
                fused_ops.add_rmsnorm(L.down(act), h, x, nxt, eps)
        return x


def build(model: torch.nn.Module, base: torch.nn.Module, hf_config: Any, windows: tuple[int, ...],
          mode: Any = "auto", epilogues: Any = "auto", plain: Any = "auto", cstack: Any = "auto",
          huge: Any = True) -> LeanStack | None:
    """The lean stack for `model` when `mode` and the model allow it, else None (transformers' modules run)."""
    if mode in (False, "off", "false"):
        return None
    if getattr(hf_config, "model_type", "") in ("gemma3_text",):   # four norms a layer, GELU, two rotary tables
        from modelcall.plugins.runner import lean_gemma
        return lean_gemma.build(base, hf_config, windows, mode, plain, cstack, huge)   # type: ignore[return-value]
    embed = getattr(base, "embed_tokens", None)
    norm = getattr(base, "norm", None)
    if not isinstance(embed, torch.nn.Embedding) and type(embed).__name__ != "QuantEmbedding" or norm is None:
        return None
    dtype, device = norm.weight.dtype, norm.weight.device
    if device.type != "cpu" or dtype not in (torch.bfloat16, torch.float32):
        return None
    if mode == "auto" and dtype != torch.bfloat16 and not _packed_fp32(base) and not _quantized(base):
        return None
    if fused_ops.load() is None:   # built here, not before: fp32 and GPU runners never compile it
        return None
    why = _unsupported(base, hf_config)
    if why:
        log.info("lean decoder not used for %s: %s", type(model).__name__, why)
        return None
    layers = []
    projections: list[tuple[Any, ...]] | None = []   # each layer's quantized weights, for the decode stack
    for i, layer in enumerate(base.layers):
        attn, mlp = layer.self_attn, layer.mlp
        lin = layer_linears(attn, mlp)
        if lin is None:
            log.info("lean decoder not used: layer %d's linears are not packed the expected way", i)
            return None
        if projections is not None:
            four = quant_parts(attn, mlp, *lin)
            projections = None if four is None else projections + [four]
        qn, kn = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        layers.append(Layer(attn, *lin, layer.input_layernorm.weight,
                            layer.post_attention_layernorm.weight, qn.weight if qn is not None else None,
                            kn.weight if kn is not None else None, float(attn.scaling), windows[i] or None))
    if epilogues not in (False, "off", "false") and dtype == torch.float32:
        _epilogues(base, layers)
    d = layers[0].attn.head_dim
    stack = LeanStack(base, layers, float(base.norm.variance_epsilon),
                      (int(hf_config.num_attention_heads), int(hf_config.num_key_value_heads), int(d)))
    stack.rehomed = rehome_weights([model], layers, huge)
    if plain not in (False, "off", "false") and cpu_kernel.load() is not None:
        stack.plain = plain_decode.DecodeAttention(stack)
    if cstack not in (False, "off", "false"):
        stack.cstack = decode_stack.DecodeStack.build(stack, projections)
    if _quantized(base):
        heap.release_free_memory()   # the fused weights' old blocks (_fused_quant), kept by the raised malloc thresholds
    log.info("lean decoder stack: %d %s layers (%s; plain decode steps in one call per layer: %s, all layers in one "
             "call: %s)", len(layers), hf_config.model_type, dtype, stack.plain is not None, stack.cstack is not None)
    return stack


def rehome_weights(modules: list[torch.nn.Module], layers: list[Layer], on: Any) -> huge_pages.Rehomed | None:
    """The weights of `modules` and of the stack's fused linears moved onto 2 MiB pages (huge_pages.py), before
    the decode stack takes their addresses; None when `on` is off or nothing moved."""
    if on in (False, "off", "false"):
        return None
    owners = [getattr(f, "__self__", None) for L in layers for f in (L.qkv, L.o, L.gate_up, L.gate, L.up, L.down)]
    return huge_pages.rehome(huge_pages.module_tensors(*modules, *(o for o in owners
                                                                   if isinstance(o, torch.nn.Module))))


def layer_linears(attn: Any, mlp: Any) -> tuple[Linear, Linear, Linear | None, Linear | None, Linear | None,
                                                 Linear] | None:
    """One layer's (qkv, o, gate_up, gate, up, down) as Layer takes them: q|k|v fused, gate|up fused when their
    weights allow (else apart); None when they are not packed or quantized a way the stack can call."""
    qkv = _fused([attn.q_proj, attn.k_proj, attn.v_proj])
    gate_up = _fused([mlp.gate_proj, mlp.up_proj]) if isinstance(
        mlp.gate_proj, (packing.FusedPart, quant.QuantLinear)) else None
    gate, up = (None, None) if gate_up is not None else (_linear(mlp.gate_proj), _linear(mlp.up_proj))
    o, down = _linear(attn.o_proj), _linear(mlp.down_proj)
    if qkv is None or o is None or down is None or (gate_up is None and (gate is None or up is None)):
        return None
    return qkv, o, gate_up, gate, up, down


def quant_parts(attn: Any, mlp: Any, qkv: Linear, o: Linear, gate_up: Linear | None, gate: Linear | None,
                up: Linear | None, down: Linear) -> tuple[Any, ...] | None:
    """One layer's four projections as the decode stack takes them (decode_stack.parts_of each), None when any is
    not quantized that way."""
    qkv_parts = decode_stack.parts_of(qkv, [attn.q_proj, attn.k_proj, attn.v_proj])
    gu_parts = (decode_stack.parts_of(gate_up, [mlp.gate_proj, mlp.up_proj]) if gate_up is not None else
                _joined(decode_stack.parts_of(gate, [mlp.gate_proj]), decode_stack.parts_of(up, [mlp.up_proj])))
    four = (qkv_parts, decode_stack.parts_of(o, [attn.o_proj]), gu_parts, decode_stack.parts_of(down, [mlp.down_proj]))
    return None if any(p is None for p in four) else four


def _joined(a: list | None, b: list | None) -> list | None:
    return a + b if a is not None and b is not None else None


def _packed(mod: Any) -> torch.Tensor | None:
    """The packed fp32 weight of a bias-free PackedLinear, else None."""
    if isinstance(mod, packing.PackedLinear) and mod.bias is None and mod.packed.dtype == torch.float32:
        return mod.packed
    return None


def _epilogues(base: torch.nn.Module, layers: list[Layer]) -> None:
    """Give fp32 layers with packed, bias-free o and down linears those GEMMs with the residual add as a oneDNN
    binary post-op (h + o(a), h + down(a): the same bits as the add apart, checked on the first layer's weights
    first; any failure or difference leaves the adds in fused_ops.add_rmsnorm).

    NOTE: measured (benchmarks/runner_before_after.py --base worktree --base-runner-config
    '{"lean_epilogues": false}', W1, fp32, Zen 3): see docs/runner.md. silu(gate) * up as gate's swish and up's
    binary mul post-ops (one thread, gate and up apart) was tried and dropped: W1 on one thread 0.90x with it."""
    mods = base.layers
    o0 = _packed(mods[0].self_attn.o_proj)
    if o0 is None:
        return
    gen = torch.Generator().manual_seed(0)
    try:
        a = torch.randn(5, mods[0].self_attn.o_proj.in_features, generator=gen)
        h = torch.randn(5, mods[0].self_attn.o_proj.out_features, generator=gen)
        if not torch.equal(packing.gemm_add(a, o0, h), packing.gemm(a, o0, None) + h):
            log.info("lean stack: the GEMM post-op add differs from the add apart; kept apart")
            return
    except RuntimeError as e:   # a torch build without binary post-ops
        log.info("lean stack: no GEMM post-ops (%s)", e)
        return
    for L, mod in zip(layers, mods):
        o, down = _packed(mod.self_attn.o_proj), _packed(mod.mlp.down_proj)
        if o is None or down is None:
            continue
        L.o_add = lambda a, h, o=o: packing.gemm_add(a, o, h)
        L.down_add = lambda a, h, down=down: packing.gemm_add(a, down, h)


def _packed_fp32(base: torch.nn.Module) -> bool:
    """Whether the runner packed this fp32 model's linears (packing.pack_fp32_linears: a large model, as a bf16
    checkpoint computed in fp32 on an AVX2-only CPU), which is when "auto" takes the lean stack in fp32.

    NOTE: measured on a Zen 3 core, one thread, W1's decode step at batch 32 in fp32 with packed linears
    (benchmarks/gemm_fraction.py --dtype float32): 86-88 ms through transformers' modules, 62.7 ms through the lean
    stack (the rest outside GEMMs, attention and the fused ops: 13 -> 2.4 ms). Small fp32 models keep the modules."""
    layers = getattr(base, "layers", None)
    attn = getattr(layers[0], "self_attn", None) if layers else None
    return isinstance(getattr(attn, "o_proj", None), packing.PackedLinear)


def _quantized(base: torch.nn.Module) -> bool:
    """Whether the layers' linears are quantized (GGUF weights, or --quantization): auto takes the lean stack then,
    in fp32 too (the quantized kernels take fp32 activations)."""
    layers = getattr(base, "layers", None)
    attn = getattr(layers[0], "self_attn", None) if layers else None
    return isinstance(getattr(attn, "o_proj", None), quant.QuantLinear)


def _unsupported(base: torch.nn.Module, hf_config: Any) -> str | None:
    norm_cls = FAMILIES.get(getattr(hf_config, "model_type", ""))
    if norm_cls is None:
        return f"model_type {getattr(hf_config, 'model_type', None)!r} is not one of {sorted(FAMILIES)}"
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        return f"activation {hf_config.hidden_act}"
    rope = getattr(hf_config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") not in STATIC_ROPE:
        return f"rope type {rope.get('rope_type')} (cos/sin depend on more than the position)"
    if not all(hasattr(base, n) for n in ("embed_tokens", "rotary_emb", "norm", "layers")):
        return "not the embed/rotary/layers/norm model layout"
    eps = {float(base.norm.variance_epsilon)}
    dtype = base.norm.weight.dtype
    for layer in base.layers:
        attn = layer.self_attn
        norms = [layer.input_layernorm, layer.post_attention_layernorm, base.norm]
        norms += [n for n in (getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)) if n is not None]
        if any(type(n).__name__ != norm_cls or n.weight.dtype != dtype for n in norms):
            return "a norm of another kind or dtype"
        eps |= {float(n.variance_epsilon) for n in norms}
        if (getattr(attn, "q_norm", None) is None) != (getattr(attn, "k_norm", None) is None):
            return "q_norm without k_norm"
        if set(dict(layer.named_children())) - {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}:
            return f"a layer with more parts: {sorted(dict(layer.named_children()))}"
        if set(dict(layer.mlp.named_children())) - {"gate_proj", "up_proj", "down_proj", "act_fn"}:
            return "an MLP of another kind (experts?)"
    if len(eps) != 1:
        return "norms with different eps"
    return None
