"""LoRA on MoE expert tensors (PEFT's `target_parameters`), applied per expert and per adapter's rows of a step.

PEFT puts LoRA on a fused 3-D expert parameter (transformers 5: `mlp.experts.gate_up_proj`, `mlp.experts.down_proj`)
with one A and one B over all experts (peft/tuners/lora/layer.py, ParamWrapper):

    lora_A.weight  [E * r, in]     expert-major rows:     A_e = A.view(E, r, in)[e]
    lora_B.weight  [out, r * E]    expert-minor columns:  B_e = B.view(out, r, E)[:, :, e]

and for a row routed to expert e the projection's output gains (x @ A_e^T) @ B_e^T * scale, in the columns of the
parameter's own output (gpt-oss's interleaved gate/up included; `in`/`out` follow `is_transposed`). Several
parameters of one experts module nest their wrappers, so their keys differ by `base_layer.` prefixes; each pair is
told apart by its shapes (gate|up reads the hidden size, down the intermediate one).

`LoraExperts` stands in for a layer's experts module: a step without expert adapter rows in this layer runs the
module itself; otherwise the module's per-expert loop is computed here, with each adapter's delta added to its own
rows of each expert (never merged into the base weights).
"""
from __future__ import annotations

from typing import Any

import torch

from modelcall.plugins.runner.lora_delta import LoraContext
from modelcall.plugins.runner.lora_weights import EXPERT_PARAMS


def expert_shapes(base: torch.nn.Module) -> dict[tuple[int, str], tuple[int, int, int]]:
    """(layer, expert parameter) -> (experts, in, out) of each decoder layer's fused experts module LoRA can reach."""
    shapes: dict[tuple[int, str], tuple[int, int, int]] = {}
    for i, layer in enumerate(getattr(base, "layers", ())):
        experts = getattr(getattr(layer, "mlp", None), "experts", None)
        if experts is not None and _servable(experts):
            for name, shape in _io(experts).items():
                shapes[(i, name)] = shape
    return shapes


def _servable(experts: torch.nn.Module) -> bool:
    # the fused layouts whose forward LoraExperts reproduces: gate|up then down, no norm after each expert.
    # NOTE: GGUF experts kept quantized (gguf_experts.QuantExperts) have no fused parameter: not served with expert LoRA
    return (isinstance(getattr(experts, "gate_up_proj", None), torch.Tensor) and
            isinstance(getattr(experts, "down_proj", None), torch.Tensor) and experts.gate_up_proj.dim() == 3 and
            getattr(experts, "has_gate", True) and not getattr(experts, "has_post_expert_norm", False) and
            hasattr(experts, "_apply_gate"))


def _io(experts: torch.nn.Module) -> dict[str, tuple[int, int, int]]:
    out = {}
    for name in EXPERT_PARAMS:
        e, d1, d2 = getattr(experts, name).shape
        # NOTE: PEFT's reading: [E, in, out] when the module computes x @ W (is_transposed), else [E, out, in]
        out[name] = (e, d1, d2) if getattr(experts, "is_transposed", False) else (e, d2, d1)
    return out


class LoraExperts(torch.nn.Module):
    """A layer's experts module with the step's expert adapters added per expert and per adapter's rows."""

    def __init__(self, base: torch.nn.Module, ctx: LoraContext, layer: int) -> None:
        super().__init__()
        self.base = base
        self.ctx = ctx
        self.layer = layer
        self.num_experts = _io(base)["gate_up_proj"][0]

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        adapters = self._adapters()
        if not adapters:
            return self.base(hidden_states, top_k_index, top_k_weights)
        slots = self.ctx.row_slots(hidden_states.shape[0], top_k_index.device)
        out = torch.zeros_like(hidden_states)
        for e in torch.unique(top_k_index).tolist():
            if e >= self.num_experts:   # transformers' masking class (expert parallelism): not an expert here
                continue
            token_idx, top_k_pos = torch.where(top_k_index == e)
            x = hidden_states[token_idx]
            row_slot = slots[token_idx]
            gate_up = self._gate_up(e, x)
            _add(adapters, "gate_up_proj", self.layer, e, row_slot, x, gate_up)
            h = self._apply_gate(gate_up)
            y = self._down(e, h)
            _add(adapters, "down_proj", self.layer, e, row_slot, h, y)
            out.index_add_(0, token_idx, (y * top_k_weights[token_idx, top_k_pos, None]).to(out.dtype))
        return out

    def _adapters(self) -> list[tuple[int, Any]]:
        """(slot, weights) of the step's adapters with expert tensors in this layer."""
        return [(k, w) for k, (w, _) in enumerate(self.ctx.groups)
                if (self.layer, "gate_up_proj") in w.experts or (self.layer, "down_proj") in w.experts]

    # the base module's own per-expert arithmetic (transformers' fused experts: use_experts_implementation's fields)
    def _gate_up(self, e: int, x: torch.Tensor) -> torch.Tensor:
        m = self.base
        y = x @ m.gate_up_proj[e] if m.is_transposed else torch.nn.functional.linear(x, m.gate_up_proj[e])
        return y + m.gate_up_proj_bias[e] if getattr(m, "has_bias", False) else y

    def _apply_gate(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self.base._apply_gate(gate_up)   # concatenated or gpt-oss's interleaved, clamped GLU

    def _down(self, e: int, h: torch.Tensor) -> torch.Tensor:
        m = self.base
        y = h @ m.down_proj[e] if m.is_transposed else torch.nn.functional.linear(h, m.down_proj[e])
        return y + m.down_proj_bias[e] if getattr(m, "has_bias", False) else y


def _add(adapters: list[tuple[int, Any]], param: str, layer: int, e: int, row_slot: torch.Tensor, x: torch.Tensor,
         y: torch.Tensor) -> None:
    """y[rows of adapter k] += x[those rows] @ A_e^T @ B_e^T for each adapter k with `param` in `layer`."""
    for k, w in adapters:
        ab = w.experts.get((layer, param))
        if ab is None:
            continue
        rows = (row_slot == k).nonzero().squeeze(1)
        if rows.numel():
            a, b = ab
            y.index_add_(0, rows, (x.index_select(0, rows) @ a[e].t()) @ b[e].t())
