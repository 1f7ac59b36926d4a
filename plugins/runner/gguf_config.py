"""The transformers config and tokenizer of a GGUF file, where transformers' own GGUF reader falls short.

transformers (5.25) rebuilds a config from llama.cpp's metadata keys for the architectures it lists. For the ones
the runner serves that it cannot read, the config is built here from the same keys: olmo2 (not listed) and gpt-oss
(its reader fails on the rope.scaling values: "only 0-dimensional arrays can be converted"). For the ones it
reads, a few keys it leaves out are read here, since the config class's defaults (one checkpoint's shapes) would
otherwise apply silently to another checkpoint:

    {arch}.attention.key_length        -> head_dim               (qwen3 stays at 128 without it)
    {arch}.expert_feed_forward_length  -> moe_intermediate_size  (qwen3moe stays at 768 without it)
    {arch}.attention.sliding_window    -> sliding_window
"""
from __future__ import annotations

from typing import Any

# llama.cpp architecture -> transformers model_type, for files transformers' GGUF config reader refuses
OWN_CONFIG = {"olmo2": "olmo2", "gpt-oss": "gpt_oss"}
MISSED_KEYS = {"attention.key_length": "head_dim", "expert_feed_forward_length": "moe_intermediate_size",
               "attention.sliding_window": "sliding_window"}


def load_config(path: str, architecture: str) -> Any:
    """The transformers config the GGUF file `path` describes."""
    import os

    from transformers import AutoConfig
    from transformers.integrations.gguf import read_gguf_metadata

    metadata, tensor_names = read_gguf_metadata(path)   # arrays left as their lengths: fast on any vocabulary
    if architecture in OWN_CONFIG:
        cfg = AutoConfig.for_model(**_dense_config(metadata, tensor_names, architecture))
    else:
        cfg = AutoConfig.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    for key, field in MISSED_KEYS.items():
        value = metadata.get(f"{architecture}.{key}")
        if value is not None and hasattr(cfg, field):
            setattr(cfg, field, int(value))
    return cfg


def load_tokenizer(path: str, architecture: str) -> Any:
    """The tokenizer of `path` (AutoTokenizer reads the config first, which fails for OWN_CONFIG architectures)."""
    import os

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    cls = PreTrainedTokenizerFast if architecture in OWN_CONFIG else AutoTokenizer
    return cls.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


def _dense_config(metadata: dict[str, Any], tensor_names: tuple[str, ...], arch: str) -> dict[str, Any]:
    """A dense decoder's config from llama.cpp's keys (the keys transformers maps for llama, qwen2, ...)."""
    key = lambda name: metadata[f"{arch}.{name}"]  # noqa: E731
    out = {
        "model_type": OWN_CONFIG[arch],
        "hidden_size": key("embedding_length"),
        "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": key("block_count"),
        "num_attention_heads": key("attention.head_count"),
        "num_key_value_heads": key("attention.head_count_kv"),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon"),
        "max_position_embeddings": key("context_length"),
        "rope_parameters": {"rope_type": "default", "rope_theta": key("rope.freq_base")},
        # the vocabulary's length where the file states no vocab_size (read_gguf_metadata gives arrays as lengths)
        "vocab_size": metadata.get(f"{arch}.vocab_size", metadata["tokenizer.ggml.tokens"]),
        # llama.cpp writes output.weight only when it is not the token embedding
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": metadata.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": metadata.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": metadata.get("tokenizer.ggml.padding_token_id"),
    }
    if metadata.get(f"{arch}.rope.scaling.type") == "yarn":
        out["rope_parameters"] |= {"rope_type": "yarn", "factor": key("rope.scaling.factor"),
                                   "original_max_position_embeddings": key("rope.scaling.original_context_length")}
    if arch == "gpt-oss":   # experts only: the feed-forward width is the experts'; gpt-oss's yarn does not truncate
        out |= {"num_local_experts": key("expert_count"), "num_experts_per_tok": key("expert_used_count"),
                "intermediate_size": key("expert_feed_forward_length")}
        out["rope_parameters"] |= {"truncate": False}
    return out
