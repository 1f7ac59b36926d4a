"""One PEFT LoRA adapter read for the runner: per decoder layer and projection, A [r, in] and B [out, r] * scale.

    adapter_config.json          r, lora_alpha, use_rslora, target_modules, rank_pattern, ...
    adapter_model.safetensors    base_model.model.model.layers.<i>.<self_attn|mlp>.<proj>.lora_A.weight  [r, in]
                                                                                     .lora_B.weight  [out, r]

The delta a row x gets at a projection is (x @ A^T) @ B^T * scale, scale = lora_alpha / r (rsLoRA: / sqrt(r)),
the r of that projection (`rank_pattern` may give a projection its own). The scale is folded into B here, once.
MoE expert adapters (`target_parameters` on `mlp.experts.gate_up_proj` / `down_proj`) are read per expert into
`experts[(layer, param)]` = (A [E, r, in], B [E, out, r] * scale) (plugins/runner/lora_experts.py has the layout).
What this runner cannot apply exactly is refused with the reason (never served half-applied): DoRA, LoRA biases,
fan_in_fan_out, `modules_to_save`, adapters on embeddings or lm_head, `alpha_pattern`, and `target_parameters` on
anything but a MoE layer's fused expert tensors.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from modelcall.core import InvalidRequest

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PART = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
        "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}   # the decoder layer's submodule of each
_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(" + "|".join(TARGETS) + r")\.lora_([AB])(?:\.[\w-]+)?\.weight$")
# PEFT's ParamWrapper on a layer's experts: one wrapper per targeted parameter, nested (hence the base_layer. runs)
_EXPERT_KEY = re.compile(r"layers\.(\d+)\.mlp\.experts\.((?:base_layer\.)*)lora_([AB])(?:\.[\w-]+)?\.weight$")
EXPERT_PARAMS = ("gate_up_proj", "down_proj")


@dataclass(slots=True)
class LoraWeights:
    """A loaded adapter: `pairs[(layer, proj)]` = (A [r, in], B [out, r] already times the scale)."""

    name: str
    path: str
    rank: int
    scale: float                                   # lora_alpha / r of the adapter's own r (rank_pattern aside)
    pairs: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
    nbytes: int = 0
    # MoE experts: (layer, "gate_up_proj" | "down_proj") -> (A [E, r, in], B [E, out, r] already times the scale)
    experts: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    # fused groups built on first use (lora_delta.GroupWeights), by (layer, projections)
    groups: dict[tuple[int, tuple[str, ...]], object] = field(default_factory=dict)

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(t for t in TARGETS if any(p == t for _, p in self.pairs)) + tuple(
            f"experts.{t}" for t in EXPERT_PARAMS if any(p == t for _, p in self.experts))


def read_adapter(name: str, path: str, shapes: dict[tuple[int, str], tuple[int, int]], max_rank: int,
                 dtype: torch.dtype, device: torch.device,
                 expert_shapes: dict[tuple[int, str], tuple[int, int, int]] | None = None) -> LoraWeights:
    """`path`'s adapter checked against the base model's projection `shapes` ((layer, proj) -> (out, in)) and
    expert tensors `expert_shapes` ((layer, param) -> (experts, in, out)), in `dtype` on `device`; InvalidRequest
    naming what is wrong."""
    cfg = _config(path)
    why = _unsupported(cfg, bool(expert_shapes))
    if why:
        raise InvalidRequest(f"LoRA adapter {name!r} ({path}): {why}; this server cannot apply it", field="lora_path")
    r = int(cfg.get("r") or 0)
    alpha = float(cfg.get("lora_alpha") or r)
    rs = bool(cfg.get("use_rslora"))
    tensors = _tensors(name, path)
    a_of: dict[tuple[int, str], torch.Tensor] = {}
    b_of: dict[tuple[int, str], torch.Tensor] = {}
    for key, t in tensors.items():
        m = _KEY.search(key)
        e = _EXPERT_KEY.search(key) if m is None else None
        if m is None and e is None:
            raise InvalidRequest(f"LoRA adapter {name!r}: tensor {key!r} is not a LoRA A/B of one of "
                                 f"{', '.join(TARGETS)} or of the experts in a decoder layer; this server applies "
                                 "only those", field="lora_path")
        # an expert wrapper's place is its nesting depth until its shapes name the parameter (_expert_pairs)
        where = (int(m.group(1)), m.group(2)) if m else (int(e.group(1)), f"#{e.group(2).count('base_layer')}")
        (a_of if (m or e).group(3) == "A" else b_of)[where] = t
    if set(a_of) != set(b_of) or not a_of:
        raise InvalidRequest(f"LoRA adapter {name!r}: {'no LoRA tensors' if not a_of else 'A without B or B without A'}"
                             f" in {path}", field="lora_path")
    scale_of = lambda rank: alpha / (math.sqrt(rank) if rs else rank)   # noqa: E731 (the projection's own r)
    pairs: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    ranks: list[int] = []
    for where, a in a_of.items():
        if where[1].startswith("#"):
            continue
        b = b_of[where]
        if where not in shapes:
            raise InvalidRequest(f"LoRA adapter {name!r}: layer {where[0]} {where[1]} is not in the base model",
                                 field="lora_path")
        out_f, in_f = shapes[where]
        rank = a.shape[0]
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != in_f or b.shape != (out_f, rank):
            raise InvalidRequest(f"LoRA adapter {name!r}: layer {where[0]} {where[1]} has A {tuple(a.shape)} and B "
                                 f"{tuple(b.shape)}; the base projection is {out_f}x{in_f} (another base model?)",
                                 field="lora_path")
        _check_rank(name, where, rank, max_rank)
        # NOTE: the product in fp32, then cast: B * scale rounded once in the serving dtype
        pairs[where] = (a.to(device=device, dtype=dtype).contiguous(),
                        (b.float() * scale_of(rank)).to(device=device, dtype=dtype).contiguous())
        ranks.append(rank)
    experts = _expert_pairs(name, a_of, b_of, expert_shapes or {}, max_rank, scale_of, dtype, device, ranks)
    nbytes = sum(t.numel() * t.element_size() for ab in (*pairs.values(), *experts.values()) for t in ab)
    return LoraWeights(name=name, path=path, rank=max(ranks), scale=scale_of(r) if r else 0.0, pairs=pairs,
                       nbytes=nbytes, experts=experts)


def _expert_pairs(name: str, a_of: dict, b_of: dict, expert_shapes: dict[tuple[int, str], tuple[int, int, int]],
                  max_rank: int, scale_of: Any, dtype: torch.dtype, device: torch.device, ranks: list[int]
                  ) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    """The expert wrappers' A/B (keyed (layer, '#depth')) as per-expert A [E, r, in] and B [E, out, r] * scale of
    the parameter whose (in, out) their shapes match (plugins/runner/lora_experts.py has PEFT's layout)."""
    out: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for (layer, depth), a in a_of.items():
        if not depth.startswith("#"):
            continue
        b = b_of[(layer, depth)]
        fits = [p for p in EXPERT_PARAMS if (layer, p) in expert_shapes and a.dim() == 2 and b.dim() == 2 and
                expert_shapes[(layer, p)][1] == a.shape[1] and expert_shapes[(layer, p)][2] == b.shape[0] and
                a.shape[0] == b.shape[1] and a.shape[0] % expert_shapes[(layer, p)][0] == 0]
        if len(fits) != 1 or (layer, fits[0]) in out:
            raise InvalidRequest(f"LoRA adapter {name!r}: the expert LoRA of layer {layer} (A {tuple(a.shape)}, B "
                                 f"{tuple(b.shape)}) fits none of this base model's expert tensors "
                                 f"(another base model?)", field="lora_path")
        param = fits[0]
        n_exp = expert_shapes[(layer, param)][0]
        rank = a.shape[0] // n_exp
        _check_rank(name, (layer, f"experts.{param}"), rank, max_rank)
        a_e = a.reshape(n_exp, rank, a.shape[1])                              # rows expert-major
        b_e = b.reshape(b.shape[0], rank, n_exp).permute(2, 0, 1)             # columns expert-minor
        out[(layer, param)] = (a_e.to(device=device, dtype=dtype).contiguous(),
                               (b_e.float() * scale_of(rank)).to(device=device, dtype=dtype).contiguous())
        ranks.append(rank)
    return out


def _check_rank(name: str, where: tuple[int, str], rank: int, max_rank: int) -> None:
    if rank > max_rank:
        raise InvalidRequest(f"LoRA adapter {name!r}: rank {rank} at layer {where[0]} {where[1]} is over "
                             f"--max-lora-rank {max_rank}", field="lora_path")


def _config(path: str) -> dict:
    f = os.path.join(path, "adapter_config.json")
    try:
        with open(f) as fh:
            cfg = json.load(fh)
    except FileNotFoundError:
        raise InvalidRequest(f"{path} is not a PEFT adapter directory: no adapter_config.json", field="lora_path") \
            from None
    except (OSError, ValueError) as e:
        raise InvalidRequest(f"{f}: {e}", field="lora_path") from None
    if not isinstance(cfg, dict):
        raise InvalidRequest(f"{f}: not a JSON object", field="lora_path")
    return cfg


def _unsupported(cfg: dict, has_experts: bool) -> str | None:
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        return f"peft_type {cfg.get('peft_type')!r} is not LORA"
    if not isinstance(cfg.get("r"), int) or cfg["r"] < 1:
        return f"r must be a positive whole number, got {cfg.get('r')!r}"
    checks = (("use_dora", "DoRA (use_dora)"), ("fan_in_fan_out", "fan_in_fan_out"), ("modules_to_save",
              "modules_to_save (fully trained modules)"), ("alpha_pattern", "alpha_pattern"),
              ("layer_replication", "layer_replication"), ("trainable_token_indices", "trainable_token_indices"),
              ("lora_bias", "lora_bias"))
    for key, what in checks:
        if cfg.get(key):
            return f"{what} is not supported"
    params = cfg.get("target_parameters") or []
    other = [p for p in params if str(p).rpartition(".")[0].rpartition(".")[2] != "experts" or
             str(p).rpartition(".")[2] not in EXPERT_PARAMS]
    if other:
        return (f"target_parameters {other} are not supported (only a MoE layer's fused expert tensors: "
                f"experts.{' / experts.'.join(EXPERT_PARAMS)})")
    if params and not has_experts:
        return (f"target_parameters {params} (LoRA on MoE expert tensors) need a MoE base model with fused expert "
                "tensors; this one has none (experts kept quantized from a GGUF file are not served with LoRA yet)")
    if cfg.get("bias", "none") != "none":
        return f"bias {cfg['bias']!r} (trained biases) is not supported"
    return None


def _tensors(name: str, path: str) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    f = os.path.join(path, "adapter_model.safetensors")
    if not os.path.isfile(f):
        raise InvalidRequest(f"LoRA adapter {name!r}: {path} has no adapter_model.safetensors (a .bin adapter? "
                             "save it with safe_serialization=True)", field="lora_path")
    try:
        return load_file(f)
    except (SafetensorError, OSError, ValueError) as e:
        raise InvalidRequest(f"LoRA adapter {name!r}: {f} does not load: {e}", field="lora_path") from None
