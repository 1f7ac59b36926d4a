"""Tiny random-weight checkpoints of today's popular architectures, built from transformers' own config
classes (fp32, a few layers, small windows so sliding attention really slides within a test prompt)."""
from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any

WINDOW = 8  # sliding window of the windowed families: prompts of 40+ tokens slide it many times over
COMMON = dict(vocab_size=2048, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=512, initializer_range=0.5,
              pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)


def _llama3(t: Any) -> Any:
    return t.LlamaConfig(**COMMON, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64})


def _qwen2(t: Any) -> Any:
    return t.Qwen2Config(**COMMON)


def _qwen3(t: Any) -> Any:
    return t.Qwen3Config(**COMMON)


def _qwen3_moe(t: Any) -> Any:
    return t.Qwen3MoeConfig(**COMMON, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                            norm_topk_prob=True)


def _mixtral(t: Any) -> Any:
    return t.MixtralConfig(**COMMON, num_local_experts=4, num_experts_per_tok=2, sliding_window=None)


def _olmo2(t: Any) -> Any:
    return t.Olmo2Config(**COMMON)


def _phi3(t: Any) -> Any:
    return t.Phi3Config(**COMMON, sliding_window=None)


def _gemma2(t: Any) -> Any:
    return t.Gemma2Config(**COMMON, sliding_window=WINDOW, query_pre_attn_scalar=24,
                          attn_logit_softcapping=5.0, final_logit_softcapping=3.0)


def _gemma3(t: Any) -> Any:
    return t.Gemma3TextConfig(**{**COMMON, "num_hidden_layers": 4}, sliding_window=WINDOW, query_pre_attn_scalar=24,
                              layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                           "sliding_attention"])


def _gpt_oss(t: Any) -> Any:
    return t.GptOssConfig(**COMMON, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
                          layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                          rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                                           "original_max_position_embeddings": 128, "beta_fast": 32.0,
                                           "beta_slow": 1.0, "truncate": False})


def _mistral(t: Any) -> Any:
    return t.MistralConfig(**COMMON, sliding_window=None)


def _mistral_window(t: Any) -> Any:
    return t.MistralConfig(**COMMON, sliding_window=WINDOW)


def _granite(t: Any) -> Any:
    return t.GraniteConfig(**COMMON, embedding_multiplier=2.0, attention_multiplier=0.2, residual_multiplier=0.5,
                           logits_scaling=4.0)


def _smollm3(t: Any) -> Any:
    return t.SmolLM3Config(**COMMON, no_rope_layer_interval=3)


FAMILIES: dict[str, Callable[[Any], Any]] = {
    "llama3": _llama3, "qwen2": _qwen2, "qwen3": _qwen3, "qwen3_moe": _qwen3_moe, "mixtral": _mixtral,
    "olmo2": _olmo2, "phi3": _phi3, "gemma2": _gemma2, "gemma3": _gemma3, "gpt_oss": _gpt_oss,
    "mistral": _mistral, "mistral_window": _mistral_window, "granite": _granite, "smollm3": _smollm3,
}

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def build_family(name: str, out_dir: str, tokenizer_dir: str, seed: int = 0, dtype: Any = None,
                 **overrides: Any) -> str:
    """Save a random-weight `name` checkpoint (and the demo model's tokenizer) to `out_dir`; `dtype` casts
    the saved weights, `overrides` are config fields."""
    import torch
    import transformers

    cfg = FAMILIES[name](transformers)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(out_dir)
    for f in TOKENIZER_FILES:
        src = os.path.join(tokenizer_dir, f)
        if os.path.exists(src):
            shutil.copy(src, os.path.join(out_dir, f))
    return out_dir
