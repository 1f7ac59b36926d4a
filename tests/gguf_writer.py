"""Tiny random HF models written as GGUF files the way llama.cpp's converter writes them, for the GGUF family tests.

What the converter does to each family, done again here with gguf's own writer and tensor-name tables:

    llama, mistral   Q and K rows permuted per head for llama.cpp's rope: (0, 1, 2, 3, ...) -> (0, 2, 4, ..., 1, 3, ...)
                     (a Mistral HF model is written as architecture "llama" with "mistral" in general.name)
    gemma2, gemma3   every RMSNorm weight stored as 1 + w (llama.cpp's norm multiplies by the weight as stored)
    phi3             the HF model's fused qkv_proj and gate_up_proj written as they are (attn_qkv, ffn_up)
    qwen3moe         experts stacked as 3-D tensors [n_expert, rows, k]: the fused gate_up_proj split in two
    gpt-oss          the same, from gpt-oss's interleaved x @ W layout; expert biases [n_expert, rows]; sinks
    every family     1-D tensors (norms, biases) F32; matrices F32, F16 or Q8_0 (gguf.quants.quantize)

The tokenizer is a small byte-level BPE ("gpt2" model): the 256 byte symbols, a few merges and <|endoftext|>.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

# the tiny shapes: head_dim * heads = hidden, every row a whole number of 32-value blocks (Q8_0, MXFP4)
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FF, LAYERS, WINDOW = 64, 4, 2, 16, 96, 2, 8
MERGES = [("Ġ", c) for c in "tainswhobcmdfplrgeuy"] + [("t", "h"), ("h", "e"), ("i", "n"), ("e", "r"), ("a", "n")]


def byte_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of the tiny byte-level BPE; the last token is <|endoftext|> (CONTROL)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = [bytes_to_unicode()[b] for b in range(256)] + [a + b for a, b in MERGES] + ["<|endoftext|>"]
    types = [1] * (len(tokens) - 1) + [3]
    return tokens, types, [f"{a} {b}" for a, b in MERGES]


VOCAB = len(byte_vocab()[0])
EOS = VOCAB - 1


def _common(**extra: Any) -> dict[str, Any]:
    return dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FF, num_hidden_layers=LAYERS,
                num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                max_position_embeddings=512, initializer_range=0.2, bos_token_id=EOS, eos_token_id=EOS,
                pad_token_id=None, tie_word_embeddings=False, rms_norm_eps=1e-5, **extra)


# llama.cpp architecture name -> the tiny HF config (from the transformers module)
CONFIGS: dict[str, Callable[[Any], Any]] = {
    "llama": lambda t: t.LlamaConfig(**_common(rope_theta=10000.0)),
    "mistral": lambda t: t.MistralConfig(**_common(sliding_window=None)),
    "qwen2": lambda t: t.Qwen2Config(**_common()),
    "qwen3": lambda t: t.Qwen3Config(**_common()),
    "qwen3moe": lambda t: t.Qwen3MoeConfig(**_common(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                                     norm_topk_prob=True)),
    "phi3": lambda t: t.Phi3Config(**_common(sliding_window=None)),
    "gemma2": lambda t: t.Gemma2Config(**{**_common(sliding_window=WINDOW), "tie_word_embeddings": True}),
    "gemma3": lambda t: t.Gemma3TextConfig(**{**_common(sliding_window=WINDOW), "tie_word_embeddings": True}),
    "olmo2": lambda t: t.Olmo2Config(**_common()),
    "gpt-oss": lambda t: t.GptOssConfig(**{**_common(num_local_experts=4, num_experts_per_tok=2,
                                                     sliding_window=WINDOW), "intermediate_size": 32,
                                          "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0,
                                                              "original_max_position_embeddings": 64, "truncate": False,
                                                              "beta_fast": 32.0, "beta_slow": 1.0}}),
}


def build_model(arch: str, seed: int = 0) -> Any:
    """The tiny random fp32 HF causal LM of `arch` (a llama.cpp architecture name)."""
    import torch
    import transformers

    cfg = CONFIGS[arch](transformers)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():   # norms start at 1 (or 0 for Gemma's 1 + w): random ones test their placement
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(p + 0.1 * torch.randn_like(p))
            if arch == "gpt-oss" and name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                # on MXFP4's grid (E2M1 values times 2^-3): every 32-block's own power-of-two scale holds them exactly
                grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
                pick = grid[torch.randint(0, 8, p.shape)] * torch.where(torch.rand(p.shape) < 0.5, -1.0, 1.0)
                p.copy_(pick / 8)
    return model


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's Q/K row order for its rope: per head, the two halves of the rotary pairs interleaved."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(model: Any, arch: str) -> list[tuple[str, np.ndarray]]:
    """(GGUF name, fp32 array in GGUF's row layout) for every tensor of `model`, as llama.cpp converts them."""
    import gguf

    cfg = model.config
    key = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == ("llama" if arch == "mistral" else arch))
    table = gguf.get_tensor_name_map(key, cfg.num_hidden_layers)
    out = []
    for hf_name, p in model.state_dict().items():
        w = p.detach().float().numpy()
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        if ".mlp.experts." in hf_name and arch == "gpt-oss":
            out += _gpt_oss_experts(hf_name, w)
            continue
        if ".mlp.experts." in hf_name:
            bid = hf_name.split(".layers.")[1].split(".")[0]
            if hf_name.endswith("gate_up_proj"):
                half = w.shape[1] // 2
                out += [(f"blk.{bid}.ffn_gate_exps.weight", w[:, :half]), (f"blk.{bid}.ffn_up_exps.weight", w[:, half:])]
            else:
                out.append((f"blk.{bid}.ffn_down_exps.weight", w))
            continue
        name = table.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is not None and name.endswith("attn_sinks"):
            name += ".weight"   # llama.cpp names the sinks vector as a weight
        if name is None:
            raise KeyError(f"{arch}: no GGUF name for {hf_name}")
        if arch in ("llama", "mistral") and (".attn_q." in name or ".attn_k." in name) and w.ndim == 2:
            w = _permute(w, cfg.num_attention_heads if ".attn_q." in name else cfg.num_key_value_heads)
        if arch in ("gemma2", "gemma3") and name.endswith("norm.weight"):
            w = w + 1
        out.append((name, np.ascontiguousarray(w)))
    return out


def _gpt_oss_experts(hf_name: str, w: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """gpt-oss keeps experts as x @ W with gate and up interleaved column by column ([E, H, 2I]: gate 0, up 0, ...);
    llama.cpp writes them de-interleaved and as rows, like every other family's experts."""
    bid = hf_name.split(".layers.")[1].split(".")[0]
    param = hf_name.rsplit(".", 1)[1]
    if param == "gate_up_proj":
        return [(f"blk.{bid}.ffn_gate_exps.weight", np.ascontiguousarray(w[:, :, 0::2].transpose(0, 2, 1))),
                (f"blk.{bid}.ffn_up_exps.weight", np.ascontiguousarray(w[:, :, 1::2].transpose(0, 2, 1)))]
    if param == "gate_up_proj_bias":
        return [(f"blk.{bid}.ffn_gate_exps.bias", np.ascontiguousarray(w[:, 0::2])),
                (f"blk.{bid}.ffn_up_exps.bias", np.ascontiguousarray(w[:, 1::2]))]
    if param == "down_proj":
        return [(f"blk.{bid}.ffn_down_exps.weight", np.ascontiguousarray(w.transpose(0, 2, 1)))]
    return [(f"blk.{bid}.ffn_down_exps.bias", w)]


def _metadata(w: Any, model: Any, arch: str) -> None:
    import gguf

    cfg = model.config
    rope = cfg.rope_parameters
    w.add_name("mistral-tiny" if arch == "mistral" else f"{arch}-tiny")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(float(rope.get("full_attention", rope)["rope_theta"]))   # Gemma 3: the global layers' base
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_vocab_size(cfg.vocab_size)
    if arch == "qwen3moe":
        w.add_expert_count(cfg.num_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    if arch == "gpt-oss":
        w.add_expert_count(cfg.num_local_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(cfg.intermediate_size)
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if getattr(cfg, "sliding_window", None):
        w.add_sliding_window(cfg.sliding_window)
    tokens, types, merges = byte_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(EOS)
    w.add_eos_token_id(EOS)
    w.add_pad_token_id(EOS)
    w.add_add_bos_token(False)


def _encode(name: str, w: np.ndarray, matrix_type: str) -> tuple[np.ndarray, Any]:
    import gguf

    if w.ndim == 1 or name.endswith(".bias") or matrix_type == "F32":
        return w.astype(np.float32), None
    if matrix_type == "F16":
        return w.astype(np.float16), None
    qtype = gguf.GGMLQuantizationType[matrix_type]
    try:
        return gguf.quants.quantize(w.astype(np.float32), qtype), qtype
    except NotImplementedError:   # a type gguf cannot write (Q8_1): zero blocks, for a file that must be refused
        block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
        return np.zeros((*w.shape[:-1], w.shape[-1] // block * nbytes), np.uint8), qtype


def write(model: Any, arch: str, path: str, matrix_type: str = "Q8_0", embedding_type: str = "F16",
          expert_type: str | None = None, architecture: str | None = None) -> str:
    """Write `model` (built by build_model(arch)) to the GGUF file `path`: matrices as `matrix_type`, the token
    embedding as `embedding_type`, 3-D expert weights as `expert_type` (default: `matrix_type`);
    `architecture` overrides general.architecture (a refused-file test)."""
    expert_type = expert_type or matrix_type
    import gguf

    w = gguf.GGUFWriter(path, architecture or ("llama" if arch == "mistral" else arch))
    _metadata(w, model, arch)
    for name, t in gguf_tensors(model, arch):
        kind = embedding_type if name.startswith("token_embd") else expert_type if "_exps.weight" in name else matrix_type
        data, raw = _encode(name, t, kind)
        if raw is None:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
