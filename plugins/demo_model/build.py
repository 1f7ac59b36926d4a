"""Build the demo model offline and byte-for-byte reproducibly: a tiny random-weight Llama with a
byte-level BPE tokenizer trained on the Python standard library and a ChatML template with tools.

Same Python (its stdlib is the tokenizer's corpus), torch and transformers: same bytes.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import sys
import sysconfig
from typing import Any

from modelcall.plugins.demo_model.template import CHAT_TEMPLATE

BUILDER_VERSION = "1"  # NOTE: bump whenever the produced files change; it names the cache directory
SEED = 0
VOCAB_SIZE = 2048
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
# GPT-2/Qwen-style split: letters, single digits, punctuation runs, newlines, spaces.
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
MODEL = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, max_position_embeddings=4096, tie_word_embeddings=True,
             initializer_range=0.5)  # 0.5, not 0.02: random weights then give varied greedy output


def corpus_files() -> list[str]:
    root = sysconfig.get_paths()["stdlib"]
    return sorted(f for f in glob.glob(os.path.join(root, "*.py")) if os.path.getsize(f) > 2000)


def build_tokenizer():  # -> transformers.PreTrainedTokenizerFast
    """The random demo model's tokenizer, trained on the standard library's sources."""
    return bpe_tokenizer(lambda tok, trainer: tok.train(corpus_files(), trainer), SPLIT,
                         MODEL["max_position_embeddings"])


def bpe_tokenizer(train: Any, split: str, max_len: int):  # -> transformers.PreTrainedTokenizerFast
    """A byte-level BPE tokenizer (NFC, `split` then bytes, VOCAB_SIZE, the ChatML specials and tags)
    that `train(tokenizer, trainer)` trains; the demo models' one recipe, corpus aside."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    # The full byte alphabet makes every string encodable (CJK, emoji: as bytes when no merge covers them).
    train(tok, trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIAL + TAGS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    # Like Qwen: the tags are added tokens but not special, so they survive skip_special_tokens
    # (tool-call and reasoning parsers read them from the text).
    spec = json.loads(tok.to_str())
    for added in spec["added_tokens"]:
        added["special"] = added["content"] in SPECIAL
    tok = Tokenizer.from_str(json.dumps(spec))
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                 model_max_length=max_len)
    hf.chat_template = CHAT_TEMPLATE
    return hf


def build_weights(tokenizer, out_dir: str) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    eos = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    cfg = LlamaConfig(vocab_size=len(tokenizer), eos_token_id=eos[0], pad_token_id=eos[1], bos_token_id=None,
                      torch_dtype="float32", **MODEL)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = LlamaForCausalLM(cfg).to(torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=eos[1], bos_token_id=None)
    model.save_pretrained(out_dir)


def write_demo_model(out_dir: str) -> str:
    """Write the demo model directory into `out_dir` (created; may exist but must be empty).
    Returns `out_dir`. Takes a few seconds."""
    os.makedirs(out_dir, exist_ok=True)
    if os.listdir(out_dir):
        raise FileExistsError(f"{out_dir} is not empty; give a new or empty directory")
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(out_dir)
    build_weights(tokenizer, out_dir)
    manifest = {"builder_version": BUILDER_VERSION, "python": "%d.%d.%d" % sys.version_info[:3],
                "corpus_sha256": _corpus_digest()}
    with open(os.path.join(out_dir, "modelcall_demo.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")
    return out_dir


def _corpus_digest() -> str:
    h = hashlib.sha256()
    for path in corpus_files():
        with open(path, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()
