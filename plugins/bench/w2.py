"""Workload W2: a serving workload with one long shared system prompt.

64 requests; each prompt is the same 1,024-token system turn, then its own 64-token user turn, then
the assistant header, in the reference model's chat format (`<|im_start|>role\\n ... <|im_end|>\\n`);
128 new tokens each. The turns' text is Python standard-library source (the text the reference
tokenizer was trained on), cut to exact token counts, so both servers see the same token ids and the
shared prefix is exactly 1,024 tokens (64 full blocks of 16: a prefix cache can hold all of it).

Rows are token ids (`prompt_token_ids`), sent as `/v1/completions` prompts, so no server's own
tokenization or template can change a count.
"""
from __future__ import annotations

import glob
import os
import sysconfig
from collections.abc import Callable, Sequence
from typing import Any

SYSTEM_TOKENS = 1024
USER_TOKENS = 64
NEW_TOKENS = 128
NUM_REQUESTS = 64

Encode = Callable[[str], list[int]]


def _source(name: str) -> str:
    path = os.path.join(sysconfig.get_paths()["stdlib"], name)
    with open(path, encoding="utf-8") as f:
        return f.read()


def _corpus() -> str:
    """Deterministic text for the user turns: the stdlib's larger modules in name order."""
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(f for f in glob.glob(os.path.join(root, "*.py")) if os.path.getsize(f) > 20000)
    return "".join(open(f, encoding="utf-8").read() for f in files[:12])


def turn(role: str, body: Sequence[int], encode: Encode, total: int) -> list[int]:
    """One chat turn of exactly `total` tokens: header, the first tokens of `body`, end marker."""
    head = encode(f"<|im_start|>{role}\n")
    tail = encode("<|im_end|>\n")
    room = total - len(head) - len(tail)
    if room <= 0 or len(body) < room:
        raise ValueError(f"a {role} turn of {total} tokens needs {room} body tokens, got {len(body)}")
    return head + list(body[:room]) + tail


def make_rows(encode: Encode, *, num_requests: int = NUM_REQUESTS, system_tokens: int = SYSTEM_TOKENS,
              user_tokens: int = USER_TOKENS, new_tokens: int = NEW_TOKENS,
              system_text: str | None = None, user_text: str | None = None) -> list[dict[str, Any]]:
    """The W2 rows: {"prompt_token_ids": system + user_i + assistant header, "max_tokens": new_tokens}.

    User turn i takes the i-th window of `user_text`'s tokens, so no two requests share more than
    the system turn.
    """
    system = turn("system", encode(system_text if system_text is not None else _source("argparse.py")),
                  encode, system_tokens)
    user_ids = encode(user_text if user_text is not None else _corpus())
    step = user_tokens
    need = num_requests * step
    if len(user_ids) < need:
        raise ValueError(f"the user text gives {len(user_ids)} tokens, {need} needed")
    assistant = encode("<|im_start|>assistant\n")
    return [{"prompt_token_ids": system + turn("user", user_ids[i * step:(i + 1) * step], encode,
                                               user_tokens) + assistant,
             "max_tokens": new_tokens} for i in range(num_requests)]


def tokenizer_encoder(model_dir: str) -> Encode:
    """The model directory's own tokenizer (tokenizer.json), special-token strings mapped to their ids."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    return lambda text: tok.encode(text, add_special_tokens=False).ids
