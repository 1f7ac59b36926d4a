"""Mixture-of-experts tensors of a GGUF file placed into a transformers experts module (qwen3moe).

llama.cpp stores a layer's experts as 3-D tensors, one matrix per expert (numpy shape [n_expert, rows, k]):

    blk.N.ffn_gate_exps  [E, I, H] --+
    blk.N.ffn_up_exps    [E, I, H] --+--> mlp.experts.gate_up_proj [E, 2I, H]   gate rows first: the forward chunks
    blk.N.ffn_down_exps  [E, H, I] -----> mlp.experts.down_proj    [E, H, I]    gate, up in that order

NOTE: experts are not kept quantized yet: each expert tensor is dequantized to the compute dtype into the module's
fused parameters (the quantized kernels take one 2-D weight per call, the experts module indexes one 3-D tensor),
so a mixture-of-experts file takes the memory of its dense checkpoint for the experts; attention, embeddings and
the router stay as gguf_weights places them.
"""
from __future__ import annotations

import re
from typing import Any

import torch

from modelcall.core import ConfigError

# GGUF expert tensor -> (the experts module's parameter, which half of it: 0 gate, 1 up, None the whole)
EXPERT_TENSORS: dict[str, tuple[str, int | None]] = {
    "ffn_gate_exps": ("gate_up_proj", 0), "ffn_up_exps": ("gate_up_proj", 1), "ffn_down_exps": ("down_proj", None)}
_HF_EXPERTS = re.compile(r"(?:model\.)?layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)")


def name_map(model: torch.nn.Module) -> dict[str, str]:
    """GGUF expert tensor name -> the fused parameter it goes into (gguf's name tables know no fused experts)."""
    out = {}
    for hf_name, _ in model.named_parameters(remove_duplicate=False):
        m = _HF_EXPERTS.fullmatch(hf_name)
        if m is None:
            continue
        for part, (param, _) in EXPERT_TENSORS.items():
            if param == m[2]:
                out[f"blk.{m[1]}.{part}.weight"] = hf_name
    return out


def place(model: torch.nn.Module, hf_name: str, t: Any, cfg: Any, arch: str, dtype: torch.dtype) -> None:
    """Put the 3-D GGUF tensor `t` into `hf_name` (a half of gate_up_proj waits on the module for the other)."""
    from modelcall.plugins.runner import gguf_weights

    part = t.name.split(".")[2]
    if part not in EXPERT_TENSORS or not hf_name.endswith(EXPERT_TENSORS[part][0]):
        raise ConfigError(f"GGUF tensor {t.name} ({arch}) is a 3-D tensor with no expert place in {hf_name}")
    value = gguf_weights._dense(gguf_weights._raw(t), t.qtype, list(t.ne))   # [E, rows, k] fp32
    path, attr = hf_name.rsplit(".", 1)
    mod = model.get_submodule(path)
    half = EXPERT_TENSORS[part][1]
    if half is not None:
        # NOTE: the parameter stays on meta until both halves came, so a file missing one is reported by name
        halves = mod.__dict__.setdefault("_gguf_halves", {})
        halves[half] = value
        if len(halves) < 2:
            return
        value = torch.cat([halves[0], halves[1]], dim=1)
        del mod.__dict__["_gguf_halves"]
    want = getattr(mod, attr)
    if tuple(want.shape) != tuple(value.shape):
        raise ConfigError(f"GGUF tensor {t.name} makes {hf_name} {tuple(value.shape)}, the model wants "
                          f"{tuple(want.shape)} (expert count or expert_feed_forward_length differ)")
    setattr(mod, attr, torch.nn.Parameter(value.to(dtype), requires_grad=False))
