"""One PEFT LoRA adapter read for the runner: per decoder layer and projection, A [r, in] and B [out, r] * scale.

    adapter_config.json          r, lora_alpha, use_rslora, target_modules, rank_pattern, ...
    adapter_model.safetensors    base_model.model.model.layers.<i>.<self_attn|mlp>.<proj>.lora_A.weight  [r, in]
                                                                                     .lora_B.weight  [out, r]

The delta a row x gets at a projection is (x @ A^T) @ B^T * scale, scale = lora_alpha / r (rsLoRA: / sqrt(r)),
the r of that projection (`rank_pattern` may give a projection its own). The scale is folded into B here, once.
What this runner cannot apply exactly is refused with the reason (never served half-applied): DoRA, LoRA biases,
fan_in_fan_out, `modules_to_save`, adapters on embeddings or lm_head, `alpha_pattern`, and `target_parameters`
(PEFT's LoRA on MoE expert tensors).
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field

import torch

from modelcall.core import InvalidRequest

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PART = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
        "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}   # the decoder layer's submodule of each
_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(" + "|".join(TARGETS) + r")\.lora_([AB])(?:\.[\w-]+)?\.weight$")


@dataclass(slots=True)
class LoraWeights:
    """A loaded adapter: `pairs[(layer, proj)]` = (A [r, in], B [out, r] already times the scale)."""

    name: str
    path: str
    rank: int
    scale: float                                   # lora_alpha / r of the adapter's own r (rank_pattern aside)
    pairs: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
    nbytes: int = 0
    # fused groups built on first use (lora_delta.GroupWeights), by (layer, projections)
    groups: dict[tuple[int, tuple[str, ...]], object] = field(default_factory=dict)

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(t for t in TARGETS if any(p == t for _, p in self.pairs))


def read_adapter(name: str, path: str, shapes: dict[tuple[int, str], tuple[int, int]], max_rank: int,
                 dtype: torch.dtype, device: torch.device) -> LoraWeights:
    """`path`'s adapter checked against the base model's projection `shapes` ((layer, proj) -> (out, in)),
    in `dtype` on `device`; InvalidRequest naming what is wrong."""
    cfg = _config(path)
    why = _unsupported(cfg)
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
        if m is None:
            raise InvalidRequest(f"LoRA adapter {name!r}: tensor {key!r} is not a LoRA A/B of one of "
                                 f"{', '.join(TARGETS)} in a decoder layer; this server applies only those",
                                 field="lora_path")
        (a_of if m.group(3) == "A" else b_of)[(int(m.group(1)), m.group(2))] = t
    if set(a_of) != set(b_of) or not a_of:
        raise InvalidRequest(f"LoRA adapter {name!r}: {'no LoRA tensors' if not a_of else 'A without B or B without A'}"
                             f" in {path}", field="lora_path")
    pairs: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    nbytes = 0
    for where, a in a_of.items():
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
        if rank > max_rank:
            raise InvalidRequest(f"LoRA adapter {name!r}: rank {rank} at layer {where[0]} {where[1]} is over "
                                 f"--max-lora-rank {max_rank}", field="lora_path")
        scale = alpha / (math.sqrt(rank) if rs else rank)   # the projection's own r (rank_pattern)
        # NOTE: the product in fp32, then cast: B * scale rounded once in the serving dtype
        a_t = a.to(device=device, dtype=dtype).contiguous()
        b_t = (b.float() * scale).to(device=device, dtype=dtype).contiguous()
        pairs[where] = (a_t, b_t)
        nbytes += a_t.numel() * a_t.element_size() + b_t.numel() * b_t.element_size()
    return LoraWeights(name=name, path=path, rank=max(a.shape[0] for a, _ in pairs.values()),
                       scale=alpha / (math.sqrt(r) if rs else r) if r else 0.0, pairs=pairs, nbytes=nbytes)


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


def _unsupported(cfg: dict) -> str | None:
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        return f"peft_type {cfg.get('peft_type')!r} is not LORA"
    if not isinstance(cfg.get("r"), int) or cfg["r"] < 1:
        return f"r must be a positive whole number, got {cfg.get('r')!r}"
    checks = (("use_dora", "DoRA (use_dora)"), ("fan_in_fan_out", "fan_in_fan_out"), ("modules_to_save",
              "modules_to_save (fully trained modules)"), ("alpha_pattern", "alpha_pattern"),
              ("target_parameters", "target_parameters (LoRA on MoE expert tensors)"),
              ("layer_replication", "layer_replication"), ("trainable_token_indices", "trainable_token_indices"),
              ("lora_bias", "lora_bias"))
    for key, what in checks:
        if cfg.get(key):
            return f"{what} is not supported"
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
