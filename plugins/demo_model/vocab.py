"""The demo model's tokenizer (plugins/demo_model/train.py trains it): the demo models' BPE recipe on the corpus
with a split that keeps every unit the model copies whole (a group of up to three digits, an operator with its
spaces, a Han character) and a name the same pieces wherever it stands, then one token for each such unit."""
from __future__ import annotations

import json
from typing import Any

from modelcall.plugins.demo_model.build import bpe_tokenizer
from modelcall.plugins.demo_model.places import HAN_NAME_CHARS

MAX_POSITIONS = 2048   # the model's context, the tokenizer's model_max_length
# Numbers in groups of up to three digits, operators with the spaces around them, one piece per Han
# character, Latin letters apart from Han ones (so "Budapest的" splits), and a space before a capitalized
# word on its own (so "in Reykjavik", '"Reykjavik' and "Reykjavik的" hold the same pieces of the name: a
# city the model never saw is copied piece by piece), then the stdlib tokenizer's split.
_LATIN = r"[\p{L}&&[^\p{Han}]]"
SPLIT = (r"\p{N}{1,3}| ?[-+*/=×÷] ?|\p{Han}|\s(?=\p{Lu})|(?i:'s|'t|'re|'ve|'m|'ll|'d)"
         r"|[^\r\n\p{L}\p{N}]?" + _LATIN + r"+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def build_tokenizer(texts: list[str]):  # -> transformers.PreTrainedTokenizerFast
    """The demo models' BPE recipe trained on the corpus with this model's split, then one token for
    every 1-3 digit group and every Han character of place names and of the corpus (merges appended, so
    nothing else tokenizes differently)."""
    hf = bpe_tokenizer(lambda tok, trainer: tok.train_from_iterator(texts, trainer), SPLIT, MAX_POSITIONS)
    units = [f"{i}" for i in range(10)] + [f"{i:02d}" for i in range(100)] + [f"{i:03d}" for i in range(1000)]
    units += [f"{i}" for i in range(10, 1000)] + han_units(texts)
    return _whole_units(hf, units)


def han_units(texts: list[str]) -> list[str]:
    """The Han characters made one token each: the place-name characters and those of the corpus."""
    seen = {ch for t in texts for ch in t if "\u4e00" <= ch <= "\u9fff"}
    return sorted(seen | set(HAN_NAME_CHARS))


def _byte_chars() -> dict[int, str]:
    # GPT-2's byte -> printable character table (what the ByteLevel pre-tokenizer emits)
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _bpe(parts: list[str], ranks: dict[tuple[str, str], int]) -> list[str]:
    while len(parts) > 1:
        best = min(((ranks.get((parts[i], parts[i + 1]), 1 << 60), i) for i in range(len(parts) - 1)))
        if best[0] == 1 << 60:
            break
        i = best[1]
        parts = parts[:i] + [parts[i] + parts[i + 1]] + parts[i + 2:]
    return parts


def _whole_units(hf: Any, units: list[str]):  # -> transformers.PreTrainedTokenizerFast
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(hf.backend_tokenizer.to_str())
    vocab, merges = spec["model"]["vocab"], spec["model"]["merges"]
    ranks = {(a, b): i for i, (a, b) in enumerate(merges)}
    table = _byte_chars()
    next_id = max(max(vocab.values()), max(t["id"] for t in spec["added_tokens"])) + 1
    for unit in dict.fromkeys(units):
        parts = _bpe([table[b] for b in unit.encode("utf-8")], ranks)
        while len(parts) > 1:  # a chain of merges left to right, ranked after every trained one
            a, b = parts[0], parts[1]
            ranks[(a, b)] = len(merges)
            merges.append([a, b])
            if a + b not in vocab:
                vocab[a + b] = next_id
                next_id += 1
            parts = [a + b] + parts[2:]
    out = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)), eos_token=hf.eos_token,
                                  pad_token=hf.pad_token, model_max_length=MAX_POSITIONS)
    out.chat_template = hf.chat_template
    split = [u for u in units if len(out(u, add_special_tokens=False).input_ids) != 1]
    assert not split, f"units that are not one token: {split[:5]}"
    return out
