"""The agent demo's third training stage (issue 45): chats of the generator weighted towards what the second stage's
adapter got wrong on the hand-written split -- compound number words read as their first digits ("fifty minus
seventeen" -> `5 - 7`), a parenthesised expression cut at its bracket, a long city name cut short or misread.

The chats are the corpus's own (`corpus.chats`, seed 0) past the first TRAIN["chats"] the earlier stages learnt:
the generator already keeps every evaluation expression and city out, and questions the split asks word for word
are dropped here; tests/test_trained_demo_eval.py checks the set.
"""
from __future__ import annotations

import itertools
import random
import re
from collections.abc import Iterator
from typing import Any

from modelcall.plugins.demo_model import corpus, evalset

POOL = 20000            # corpus.chats(POOL, seed) is drawn from past its first `start` chats
STAGE_CHATS = 320       # the chats of the stage tried (lora_train --focus 320); its adapter was not kept
KEEP_OTHERS = 0.6       # the share of other chats kept, so the stage does not forget when not to call a tool
_NUMBER = re.compile(r"\d+")


def tool_call(chat: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """(tool name, arguments) of the chat's first call, or None for a chat without one."""
    for m in chat["messages"]:
        for c in m.get("tool_calls") or []:
            return c["function"]["name"], c["function"]["arguments"]
    return None


def weak_spot(chat: dict[str, Any]) -> bool:
    """True for a chat of a kind the second stage missed: an operand of two or more digits written in words
    (English or Chinese), a parenthesised expression, or a city name of 7+ letters (3+ characters in Chinese)."""
    call = tool_call(chat)
    if call is None:
        return False
    name, args = call
    question = chat["messages"][0]["content"]
    if name == "calculator":
        expression = args["expression"]
        worded = [n for n in _NUMBER.findall(expression) if len(n) >= 2 and n not in _NUMBER.findall(question)]
        return "(" in expression or bool(worded)
    city = str(args.get("city", ""))
    return len(city) >= (3 if any(ord(ch) > 0x2e80 for ch in city) else 7)


def focus_chats(n: int, start: int, seed: int = 0) -> Iterator[dict[str, Any]]:
    """`n` chats of corpus.chats(POOL, seed) past its first `start`: every weak-spot chat and a KEEP_OTHERS share
    of the rest, none asking an evaluation question word for word."""
    rng = random.Random(seed)
    asked = {" ".join(r["question"].split()).casefold() for r in evalset.load()}
    kept = 0
    for chat in itertools.islice(corpus.chats(POOL, seed=seed), start, None):
        if kept == n:
            return
        if " ".join(chat["messages"][0]["content"].split()).casefold() in asked:
            continue
        if weak_spot(chat) or rng.random() < KEEP_OTHERS:
            kept += 1
            yield chat
