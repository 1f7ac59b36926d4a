"""LoRA in the torch runner: the adapter registry, the projections wrapped to add each step's deltas, and the
step's rows per adapter (plugins/runner/lora_delta.py does the arithmetic).

The lean stack's projections are wrapped where the lean stack runs (its fused q|k|v and gate|up GEMMs take the
adapters' stacked shrink and block-diagonal expand); otherwise the transformers modules of the decoder's
projections are, and each MoE layer's experts module (plugins/runner/lora_experts.py). A step with adapter rows never
takes the paths that bypass those projections (the all-layers C decode stack, CUDA graphs): `StepBatch.lora` tells
them.
"""
from __future__ import annotations

from typing import Any

import torch

from modelcall.core import ConfigError, KernelConfig, SchedulePlan
from modelcall.plugins.runner.batch import StepBatch
from modelcall.plugins.runner.lora_delta import LoraContext, LoraModule, step_groups, wrap_linear, wrap_residual
from modelcall.plugins.runner.lora_experts import LoraExperts, expert_shapes
from modelcall.plugins.runner.lora_registry import LoraRegistry, projection_shapes
from modelcall.plugins.runner.lora_weights import PART, TARGETS

QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")


class RunnerLora:
    """One runner's adapters (`registry`, the core.lora.LoraCatalog) and the step context its projections read."""

    def __init__(self, model: torch.nn.Module, base: torch.nn.Module, lean: Any, config: KernelConfig,
                 dtype: torch.dtype, device: torch.device) -> None:
        if not hasattr(base, "layers"):
            raise ConfigError(f"{type(model).__name__}: LoRA needs a decoder with `layers` (the Llama-like layout)")
        self.shapes = projection_shapes(base)
        self.expert_shapes = expert_shapes(base)
        if not self.shapes and not self.expert_shapes:
            raise ConfigError(f"{type(model).__name__}: no q/k/v/o, gate/up/down projections or experts to put LoRA on")
        self.ctx = LoraContext()
        self.device = device
        self.registry = LoraRegistry(self.shapes, dtype, device, config.max_lora_rank, config.max_cpu_loras,
                                     self.expert_shapes)
        if lean is not None:
            self._wrap_lean(lean)
        else:
            self._wrap_modules(base)
        for name, path in config.lora_modules.items():
            self.registry.register(name, path)

    def _wrap_lean(self, lean: Any) -> None:
        ctx, shapes = self.ctx, self.shapes
        for i, L in enumerate(lean.layers):
            w = {p: shapes[(i, p)][0] for p in TARGETS if (i, p) in shapes}
            L.qkv = wrap_linear(L.qkv, ctx, i, QKV, tuple(w[p] for p in QKV))
            L.o = wrap_linear(L.o, ctx, i, ("o_proj",), (w["o_proj"],))
            if L.o_add is not None:
                L.o_add = wrap_residual(L.o_add, ctx, i, "o_proj", w["o_proj"])
            if L.gate_up is not None:
                L.gate_up = wrap_linear(L.gate_up, ctx, i, GATE_UP, (w["gate_proj"], w["up_proj"]))
            else:
                L.gate = wrap_linear(L.gate, ctx, i, ("gate_proj",), (w["gate_proj"],))
                L.up = wrap_linear(L.up, ctx, i, ("up_proj",), (w["up_proj"],))
            L.down = wrap_linear(L.down, ctx, i, ("down_proj",), (w["down_proj"],))
            if L.down_add is not None:
                L.down_add = wrap_residual(L.down_add, ctx, i, "down_proj", w["down_proj"])

    def _wrap_modules(self, base: torch.nn.Module) -> None:
        for i, layer in enumerate(base.layers):
            for name in TARGETS:
                if (i, name) in self.shapes:
                    mod = getattr(layer, PART[name])
                    setattr(mod, name, LoraModule(getattr(mod, name), self.ctx, i, name))
            if (i, "gate_up_proj") in self.expert_shapes:   # the MoE experts: per expert, per adapter's rows
                layer.mlp.experts = LoraExperts(layer.mlp.experts, self.ctx, i)

    def begin(self, plan: SchedulePlan, step: StepBatch) -> None:
        """Set the step's rows per adapter (before its forward)."""
        keys: list[str] = []
        groups = step_groups(plan.chunks, step.last_rows, self.registry.weights, keys) if _any_lora(plan) else []
        self.ctx.set(groups, keys, self.device)
        step.lora = groups or None

    def end(self) -> None:
        self.ctx.clear()


def _any_lora(plan: SchedulePlan) -> bool:
    return any(c.request.lora is not None for c in plan.chunks)


def plan_has_lora(plan: SchedulePlan) -> bool:
    """Whether a row of `plan` runs on an adapter (then no captured decode graph may replay it)."""
    return _any_lora(plan)
