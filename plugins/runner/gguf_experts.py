"""Mixture-of-experts tensors of a GGUF file placed into the model's experts modules (qwen3moe, gpt-oss).

llama.cpp stores a layer's experts as 3-D tensors, one matrix per expert (numpy shape [n_expert, rows, k]):

    blk.N.ffn_gate_exps  [E, I, H] --+
    blk.N.ffn_up_exps    [E, I, H] --+--> mlp.experts.gate_up_proj [E, 2I, H]   gate rows first: the forward chunks
    blk.N.ffn_down_exps  [E, H, I] -----> mlp.experts.down_proj    [E, H, I]    gate, up in that order

gpt-oss's experts compute x @ W with gate and up interleaved column by column: gate_up_proj [E, H, 2I] (gate 0,
up 0, gate 1, ...), down_proj [E, I, H], and a bias per expert (ffn_*_exps.bias [E, rows] -> *_proj_bias), its
weights in MXFP4 (dequantized here with gguf's own NumPy code: the kernels do not take MXFP4).

qwen3moe's experts stay quantized: the experts module is replaced by QuantExperts, one QuantLinear per expert and
projection over that expert's rows of the 3-D tensor's bytes (the same kernels as every other linear), so the
experts take the file's bytes in memory. NOTE: gpt-oss's experts are not kept quantized yet: MXFP4 has no kernel
here, so they are dequantized to the compute dtype into the module's fused parameters (the memory of a dense
checkpoint for the experts). Attention, embeddings and the router stay as gguf_weights places them.
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch

from modelcall.core import ConfigError

# GGUF expert tensor -> (the experts module's parameter, which half of it: 0 gate, 1 up, None the whole)
EXPERT_TENSORS: dict[str, tuple[str, int | None]] = {
    "ffn_gate_exps": ("gate_up_proj", 0), "ffn_up_exps": ("gate_up_proj", 1), "ffn_down_exps": ("down_proj", None)}
_HF_EXPERTS = re.compile(r"(?:model\.)?layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)(_bias)?")
INTERLEAVED = ("gpt-oss",)   # gate/up interleaved by column, matrices as x @ W


def name_map(model: torch.nn.Module) -> dict[str, str]:
    """GGUF expert tensor name -> the fused parameter it goes into (gguf's name tables know no fused experts)."""
    out = {}
    for hf_name, _ in model.named_parameters(remove_duplicate=False):
        m = _HF_EXPERTS.fullmatch(hf_name)
        if m is None:
            continue
        for part, (param, _) in EXPERT_TENSORS.items():
            if param == m[2]:
                out[f"blk.{m[1]}.{part}.{'bias' if m[3] else 'weight'}"] = hf_name
    return out


class QuantExperts(torch.nn.Module):
    """transformers' fused experts module (Qwen3MoeExperts' forward) over quantized weights: per expert, gate, up
    and down QuantLinears. Until the file gave a projection, a meta parameter of the fused name stands for it, so
    the loader's missing-tensor check names what a file lacks."""

    def __init__(self, experts: torch.nn.Module) -> None:
        super().__init__()
        self.num_experts = experts.num_experts
        self.act_fn = experts.act_fn
        self.gate, self.up, self.down = (torch.nn.ModuleList() for _ in range(3))
        e, two_i, h = experts.gate_up_proj.shape
        self.expected = {"ffn_gate_exps": (e, two_i // 2, h), "ffn_up_exps": (e, two_i // 2, h),
                         "ffn_down_exps": tuple(experts.down_proj.shape)}   # [E, rows, k] of each GGUF tensor
        for name in ("gate_up_proj", "down_proj"):
            self.register_parameter(name, getattr(experts, name))

    def fill(self, part: str, t: Any) -> None:
        """The expert tensor `t` (GGUF part ffn_gate_exps, ffn_up_exps or ffn_down_exps) as one QuantLinear a row."""
        from modelcall.plugins.runner import gguf_weights, quant

        k, n, e = t.ne
        rows = gguf_weights._raw(t).reshape(e, n, -1)
        target = {"ffn_gate_exps": self.gate, "ffn_up_exps": self.up, "ffn_down_exps": self.down}[part]
        target.extend(quant.QuantLinear(quant.qweight_from_bytes(np.array(rows[i]), t.qtype, n, k))
                      for i in range(e))
        if part == "ffn_down_exps":
            del self._parameters["down_proj"]
        elif len(self.gate) and len(self.up):
            del self._parameters["gate_up_proj"]

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(hidden_states)
        for e in torch.unique(top_k_index).tolist():
            token_idx, top_k_pos = torch.where(top_k_index == e)
            x = hidden_states[token_idx]
            h = self.down[e](self.act_fn(self.gate[e](x)) * self.up[e](x))
            out.index_add_(0, token_idx, (h * top_k_weights[token_idx, top_k_pos, None]).to(out.dtype))
        return out


def place(model: torch.nn.Module, hf_name: str, t: Any, cfg: Any, arch: str, dtype: torch.dtype) -> None:
    """Put the 3-D GGUF tensor `t` into `hf_name`: kept quantized in a QuantExperts (qwen3moe), or dequantized
    (gpt-oss: a half of gate_up_proj waits on the module for the other)."""
    part = t.name.split(".")[2]
    path, attr = hf_name.rsplit(".", 1)
    if part not in EXPERT_TENSORS or attr.removesuffix("_bias") != EXPERT_TENSORS[part][0]:
        raise ConfigError(f"GGUF tensor {t.name} ({arch}) has no expert place in {hf_name}")
    if arch not in INTERLEAVED and not attr.endswith("_bias"):
        _keep_quantized(model, path, hf_name, part, t)
        return
    value = _values(t)   # [E, rows, k] (a bias: [E, rows]) fp32
    mod = model.get_submodule(path)
    half = EXPERT_TENSORS[part][1]
    if half is not None:
        # NOTE: the parameter stays on meta until both halves came, so a file missing one is reported by name
        halves = mod.__dict__.setdefault("_gguf_halves", {}).setdefault(attr, {})
        halves[half] = value
        if len(halves) < 2:
            return
        del mod.__dict__["_gguf_halves"][attr]
        value = (torch.stack([halves[0], halves[1]], dim=2).flatten(1, 2) if arch in INTERLEAVED
                 else torch.cat([halves[0], halves[1]], dim=1))
    if arch in INTERLEAVED and value.ndim == 3:
        value = value.transpose(1, 2).contiguous()
    want = getattr(mod, attr)
    if tuple(want.shape) != tuple(value.shape):
        raise ConfigError(f"GGUF tensor {t.name} makes {hf_name} {tuple(value.shape)}, the model wants "
                          f"{tuple(want.shape)} (expert count or expert_feed_forward_length differ)")
    setattr(mod, attr, torch.nn.Parameter(value.to(dtype), requires_grad=False))


def _keep_quantized(model: torch.nn.Module, path: str, hf_name: str, part: str, t: Any) -> None:
    mod = model.get_submodule(path)
    if not isinstance(mod, QuantExperts):
        mod = QuantExperts(mod)
        parent, _, child = path.rpartition(".")
        setattr(model.get_submodule(parent), child, mod)
    k, n, e = t.ne
    if (e, n, k) != mod.expected[part]:
        raise ConfigError(f"GGUF tensor {t.name} is [{e}, {n}, {k}] (experts, rows, k), {hf_name} wants "
                          f"{list(mod.expected[part])} of it (expert count or expert_feed_forward_length differ)")
    mod.fill(part, t)


def _values(t: Any) -> torch.Tensor:
    """The tensor dequantized to fp32 in numpy order: the runner's decoders where they know the type, else gguf's."""
    import gguf

    from modelcall.plugins.runner import gguf_weights, quant

    if t.qtype in gguf_weights.FLOAT_TYPES or t.qtype in quant.GGML_TYPES.values():
        return gguf_weights._dense(gguf_weights._raw(t), t.qtype, list(t.ne))
    rows = np.asarray(t.data).reshape(int(np.prod(t.ne[1:])), -1)
    values = gguf.quants.dequantize(rows, gguf.GGMLQuantizationType(t.qtype))
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32).reshape(tuple(reversed(t.ne))))
