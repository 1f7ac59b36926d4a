"""Load a local Hugging Face model directory and describe it: device, dtypes, ModelSpec, identity."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from modelcall.core import ConfigError, KernelConfig, ModelSpec

log = logging.getLogger("modelcall.runner")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# fp8 KV caches (vLLM's names; "fp8" is E4M3), one byte per value, no scale: CPU only (the C kernel reads them)
FP8_KV = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


@dataclass(frozen=True, slots=True)
class Placement:
    """Where and in which number formats the model runs."""

    device: torch.device
    dtype: torch.dtype       # weights and activations
    kv_dtype: torch.dtype    # the paged KV cache


def read_json(model_dir: str, name: str) -> dict[str, Any]:
    path = os.path.join(model_dir, name)
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def checkpoint_dtype(hf_config: dict[str, Any]) -> torch.dtype:
    name = hf_config.get("dtype") or hf_config.get("torch_dtype") or "float32"
    return DTYPES.get(str(name).removeprefix("torch."), torch.float32)


def resolve_placement(config: KernelConfig, hf_config: dict[str, Any], gguf: bool = False) -> Placement:
    """auto: CUDA when present (bf16 compute and KV). On CPU an fp32 checkpoint computes in fp32; a bf16
    checkpoint computes in whichever of fp32 and bf16 is faster here (`faster_cpu_dtype`) and keeps its
    KV in bf16 (attention reads half the bytes). A GGUF file (`gguf`: 16-bit or quantized weights) computes in fp32
    and keeps its KV in bf16 as well, as llama.cpp keeps an f16 cache by default: an fp32 cache doubled the bytes a
    decode step's attention reads (SmolLM2 Q8_0, one thread, 256 new tokens: 8.1-8.4 against 7.5-7.8 ms a token),
    and its numerics stay within issue 37's bar (tests/test_gguf_models.py runs both caches). kv_cache_dtype fp8
    (E4M3) or fp8_e5m2 halves that again, lossily: asked for, never chosen by auto."""
    if config.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(config.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"device {config.device!r} asked for but CUDA is not available; use device='cpu' or 'auto'")
    ckpt = checkpoint_dtype(hf_config)
    if config.dtype != "auto":
        dtype = DTYPES[config.dtype]
    elif device.type == "cuda":
        dtype = torch.bfloat16
    elif ckpt == torch.bfloat16:
        dtype = faster_cpu_dtype(hf_config)
    else:
        dtype = torch.float32
    kv = config.kv_cache_dtype
    if kv == "auto":
        kv_dtype = dtype if device.type == "cuda" or (ckpt == torch.float32 and not gguf) else torch.bfloat16
    elif kv in DTYPES:
        kv_dtype = DTYPES[kv]
    elif kv in FP8_KV:
        if device.type != "cpu":
            raise ConfigError(f"kv_cache_dtype {kv!r} runs on CPU only (the CUDA attention kernels read 16- and 32-bit "
                              "caches); use auto, bfloat16 or float16 there")
        kv_dtype = FP8_KV[kv]
    else:
        raise ConfigError(f"kv_cache_dtype must be auto, float32, bfloat16, float16, fp8, fp8_e4m3 or fp8_e5m2, "
                          f"got {kv!r}")
    return Placement(device, dtype, kv_dtype)


def faster_cpu_dtype(hf_config: dict[str, Any]) -> torch.dtype:
    """For a bf16 checkpoint on CPU: bf16 or fp32 compute, whichever runs this model's linear layers faster
    at a decode-sized batch on this machine.

    NOTE: measured, not assumed. Without AMX, fp32 (MKL) can beat bf16 (oneDNN) on a quiet CPU, but
    decode matmuls stream the weights, and on a busy or bandwidth-starved machine bf16's half-size
    weights won 2x here (2026-11-29). The probe takes ~0.1 s; fp32 checkpoints are never downcast.
    """
    hidden = int(hf_config.get("hidden_size") or 0)
    inter = int(hf_config.get("intermediate_size") or 4 * hidden)
    if not hidden:
        return torch.float32
    count = max(1, min(8, (16 << 20) // (hidden * inter)))   # ~64 MB of fp32 weights: more than a cache holds
    x = torch.randn(32, hidden)
    weights = [torch.randn(inter, hidden) for _ in range(count)]

    def best_time(dtype: torch.dtype) -> float:
        xs, ws = x.to(dtype), [w.to(dtype) for w in weights]
        best = float("inf")
        for _ in range(4):
            t0 = time.perf_counter()
            for w in ws:
                torch.nn.functional.linear(xs, w)
            best = min(best, time.perf_counter() - t0)
        return best

    with torch.inference_mode():
        fp32, bf16 = best_time(torch.float32), best_time(torch.bfloat16)
    choice = torch.bfloat16 if bf16 < 0.9 * fp32 else torch.float32
    log.info("bf16 checkpoint on CPU: linear probe fp32 %.1f ms, bf16 %.1f ms -> computing in %s",
             fp32 * 1e3, bf16 * 1e3, choice)
    return choice


def model_identity(model_dir: str) -> str:
    """A hash of the model's config and its weight files' names and sizes: two models never share
    prefix-cache blocks, and the same files always give the same identity (cheap: no weights read)."""
    h = hashlib.sha256()
    for name in ("config.json", "generation_config.json"):
        path = os.path.join(model_dir, name)
        if os.path.exists(path):
            with open(path, "rb") as f:
                h.update(name.encode() + b"\0" + f.read() + b"\0")
    for name in sorted(os.listdir(model_dir)):
        if name.endswith((".safetensors", ".bin", ".pt", ".pth")):
            h.update(f"{name}:{os.path.getsize(os.path.join(model_dir, name))}\0".encode())
    gguf = os.path.join(model_dir, "gguf.json")   # a GGUF file's description: its directory name is its content key
    if os.path.exists(gguf):
        h.update(os.path.basename(os.path.normpath(model_dir)).encode())
    return h.hexdigest()[:32]


def eos_token_ids(model_dir: str, hf_config: dict[str, Any]) -> frozenset[int]:
    gen = read_json(model_dir, "generation_config.json")
    eos = gen.get("eos_token_id", hf_config.get("eos_token_id"))
    if eos is None:
        return frozenset()
    return frozenset([eos] if isinstance(eos, int) else eos)


def check_model_dir(model_dir: str) -> dict[str, Any]:
    if not os.path.isdir(model_dir):
        raise ConfigError(f"model directory {model_dir!r} does not exist")
    hf_config = read_json(model_dir, "config.json")
    if not hf_config:
        raise ConfigError(f"{model_dir!r} has no config.json; give a Hugging Face model directory")
    return hf_config


def unsupported_features(cfg: Any) -> list[str]:
    """Attention features the paged kernel does not implement (it would silently compute something else).

    Per-layer sliding windows, soft-capping, sinks and scaling reach the kernel with every call (see
    attention.py); what is listed here changes attention in ways no call tells it."""
    bad = []
    if getattr(cfg, "attention_chunk_size", None):
        bad.append(f"chunked local attention (attention_chunk_size={cfg.attention_chunk_size})")
    if getattr(cfg, "use_bidirectional_attention", False):
        bad.append("bidirectional attention")
    if getattr(cfg, "alibi", False) or getattr(cfg, "position_embedding_type", None) == "alibi":
        bad.append("ALiBi position biases")
    if getattr(cfg, "is_encoder_decoder", False):
        bad.append("encoder-decoder attention")
    return bad


def layer_windows(cfg: Any) -> tuple[int, ...]:
    """Per layer, the sliding window in tokens (0: full attention), as the families' definitions read it:
    `layer_types` where the config has them, else one `sliding_window` for every layer (Mistral, Mixtral,
    Phi-3) unless `use_sliding_window` is off."""
    n = int(cfg.num_hidden_layers)
    window = int(getattr(cfg, "sliding_window", None) or 0)
    types = getattr(cfg, "layer_types", None)
    if types:
        return tuple(window if t == "sliding_attention" else 0 for t in types[:n])
    if not getattr(cfg, "use_sliding_window", True):
        return (0,) * n
    return (window,) * n


def served_name(model_dir: str, model: str | None) -> str:
    """The model's name in the API: a hub id as given (as vLLM does), a GGUF file by its stem (not the path or the
    cache directory describing it), a built-in name as given, else the directory's own name."""
    gguf = read_json(model_dir, "gguf.json")
    if model and not os.path.exists(os.path.expanduser(model)):
        return model
    if gguf.get("gguf_file"):
        return os.path.basename(gguf["gguf_file"]).removesuffix(".gguf")
    return os.path.basename(os.path.normpath(model_dir))


def build_spec(model_dir: str, config: KernelConfig, cfg: Any, hf_config: dict[str, Any],
               placement: Placement, windows: tuple[int, ...] | None = None) -> ModelSpec:
    """`windows`: each layer's sliding window as observed (runner.probe_layer_windows); None: read from the
    config (`layer_windows`)."""
    # NOTE: a sliding window does not cap the context: the kernel slides it (keys pos-W+1..pos).
    max_len = int(getattr(cfg, "max_position_embeddings", 0) or 2048)
    if config.max_model_len is not None:
        if config.max_model_len > max_len:
            raise ConfigError(f"max_model_len {config.max_model_len} exceeds the model's {max_len} positions")
        max_len = config.max_model_len
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return ModelSpec(
        name=served_name(model_dir, config.model),
        max_model_len=max_len,
        vocab_size=int(cfg.vocab_size),
        num_layers=int(cfg.num_hidden_layers),
        num_kv_heads=int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads),
        head_dim=int(head_dim),
        dtype=str(placement.dtype).removeprefix("torch."),
        device=str(placement.device),
        eos_token_ids=eos_token_ids(model_dir, hf_config),
        # weights quantized at load are other weights: no prefix-cache block is shared with the model as stored
        identity=model_identity(model_dir) if not config.quantization else hashlib.sha256(
            f"{model_identity(model_dir)}:{config.quantization}".encode()).hexdigest()[:32],
        layer_windows=layer_windows(cfg) if windows is None else windows,
    )
