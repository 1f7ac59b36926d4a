"""Training rows of the demo model: chats rendered with the served chat template (as `modelcall serve` renders them for
`modelcall agent`), cut into pieces learnt or not, and grouped by their shared system block."""
from __future__ import annotations

import random
from typing import Any


def render(tok: Any, messages: list[dict], tools: list[dict] | None, gen: bool = False) -> str:
    return tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen)


_FAST: list[Any] = []


def fast_render(tok: Any, messages: list[dict], tools: list[dict] | None, gen: bool = False) -> str:
    """`render` without transformers' per-call preparation (copies, checks): the compiled template
    itself, a fifth of the time. `check_fast_render` holds it to `render` on a sample."""
    if not _FAST:
        try:
            from transformers.utils.chat_template_utils import _compile_jinja_template
            _FAST.append(_compile_jinja_template(tok.chat_template))
        except ImportError:  # another transformers: the public path, slower
            _FAST.append(None)
    if _FAST[0] is None:
        return render(tok, messages, tools, gen)
    return _FAST[0].render(messages=messages, tools=tools, documents=None, add_generation_prompt=gen)


def check_fast_render(tok: Any, chats: list[dict[str, Any]]) -> None:
    for c in chats:
        for gen in (False, True):
            assert fast_render(tok, c["messages"], c["tools"], gen) == render(tok, c["messages"], c["tools"], gen)


def examples(tok: Any, chat: dict[str, Any]) -> list[tuple[str, list[tuple[str, bool]]]]:
    """A chat as training rows: (system block, [(text, learn it)]). A chat whose first call had a
    `<think>` gives two rows, as a server sees them: the first turn with its thinking, and the whole
    chat without it (the agent does not send reasoning back), learning the last answer only."""
    tools, msgs = chat["tools"], chat["messages"]
    system = fast_render(tok, msgs[:1], tools).split("<|im_start|>user", 1)[0]
    rows = []
    plain = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in msgs]
    if any(m.get("reasoning_content") for m in msgs):
        first = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
        rows.append(_pieces(tok, msgs[:first + 1], tools, system, learn_from=first))
        rows.append(_pieces(tok, plain, tools, system, learn_from=len(plain) - 1))
    else:
        rows.append(_pieces(tok, plain, tools, system, learn_from=0))
    return [(system, r) for r in rows]


def _pieces(tok: Any, msgs: list[dict], tools: Any, system: str, learn_from: int) -> list[tuple[str, bool]]:
    out, done = [], system
    for i, m in enumerate(msgs):
        if m["role"] == "assistant":
            prompt = fast_render(tok, msgs[:i], tools, gen=True)
            out.append((prompt[len(done):], False))
            full = fast_render(tok, msgs[:i + 1], tools)
            reply = full[len(prompt):]
            assert reply.endswith("<|im_end|>\n"), reply
            out.append((reply[:-1], i >= learn_from))
            out.append(("\n", False))
            done = full
    return out


def tokenize_rows(tok: Any, rows: list[tuple[str, list[tuple[str, bool]]]]) -> dict[str, list]:
    """Group rows by system block: {system text: [(ids, learn mask)]}. Each piece ends at a special
    token, so the pieces' ids are the whole text's ids (the test checks against the server's)."""
    groups: dict[str, list] = {}
    texts = [text for _, pieces in rows for text, _ in pieces]
    encoded = iter(tok(texts, add_special_tokens=False).input_ids if texts else [])
    for system, pieces in rows:
        ids, mask = [], []
        for _, learn in pieces:
            t = next(encoded)
            ids += t
            mask += [learn] * len(t)
        groups.setdefault(system, []).append((ids, mask))
    return groups


def batches(groups: dict[str, list], size: int, rng: random.Random) -> list[tuple[str, list]]:
    """One epoch of (system block, rows) batches: shuffled, then sorted by length within windows of 8 batches
    (little padding, kinds mixed)."""
    out = []
    for system in sorted(groups):
        items = list(groups[system])
        rng.shuffle(items)
        window = size * 8
        for w in range(0, len(items), window):
            chunk = sorted(items[w:w + window], key=lambda r: len(r[0]))
            out += [(system, chunk[i:i + size]) for i in range(0, len(chunk), size)]
    rng.shuffle(out)
    return out
