"""The context budget: what a chat prompt spends its tokens on, and the explicit drop-oldest policy.

Pure functions over OpenAI-style messages and a tokenizer (anything with `encode` and
`apply_chat_template`). The parts always add up to the prompt's token count:

    system + tools + history + tool_results + user + template == len(prompt_token_ids)

`template` is what the chat template adds around the contents (role markers, separators);
`tools` is measured as the difference the tool definitions make to the rendered prompt.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

PARTS = ("system", "tools", "history", "tool_results", "user", "template")
POLICIES = ("error", "drop_oldest")


def message_text(message: dict[str, Any]) -> str:
    """The text a message carries (string content, text parts, tool-call arguments)."""
    content = message.get("content")
    out: list[str] = []
    if isinstance(content, str):
        out.append(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict):
                text = part.get("text") if isinstance(part.get("text"), str) else part.get("content")
                if isinstance(text, str):
                    out.append(text)
            elif isinstance(part, str):
                out.append(part)
    for call in message.get("tool_calls") or ():
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            out.append(str(fn.get("name", "")))
            args = fn.get("arguments", "")
            out.append(args if isinstance(args, str) else str(args))
    return "\n".join(out)


def _last_user_index(messages: Sequence[dict[str, Any]]) -> int:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return i
    return len(messages)


def part_of(messages: Sequence[dict[str, Any]], i: int, last_user: int | None = None) -> str:
    """Which part message `i` belongs to: system, history, tool_results or user."""
    role = messages[i].get("role")
    if role in ("system", "developer"):
        return "system"
    last_user = _last_user_index(messages) if last_user is None else last_user
    if i < last_user:
        return "history"
    if role == "tool":
        return "tool_results"
    return "user" if role == "user" else "history"


def count_parts(messages: Sequence[dict[str, Any]], prompt_tokens: int, encode: Callable[[str], list[int]],
                tools_tokens: int = 0) -> dict[str, int]:
    """Prompt tokens by part; `template` takes the remainder so the parts sum to `prompt_tokens`.

    `tools_tokens` is what the tool definitions add to the rendered prompt (see `tools_cost`).
    """
    parts = dict.fromkeys(PARTS, 0)
    parts["tools"] = tools_tokens
    last_user = _last_user_index(messages)
    for i, m in enumerate(messages):
        text = message_text(m)
        if text:
            parts[part_of(messages, i, last_user)] += len(encode(text))
    parts["template"] = prompt_tokens - sum(v for k, v in parts.items() if k != "template")
    return parts


def tools_cost(render: Callable[[list[dict[str, Any]] | None], str], encode: Callable[[str], list[int]],
               prompt_tokens: int, tools: list[dict[str, Any]] | None) -> int:
    """Tokens the tool definitions add: the prompt with them minus the prompt rendered without them."""
    if not tools:
        return 0
    return prompt_tokens - len(encode(render(None)))


def drop_units(messages: Sequence[dict[str, Any]]) -> list[list[int]]:
    """The droppable units of history, oldest first: each a list of message indexes.

    A unit is a user message, or an assistant message with the tool results that answer it (a
    tool call is never separated from its result). System messages, the last user message and
    everything after the last unit that contains it are never dropped.
    """
    last_user = _last_user_index(messages)
    units: list[list[int]] = []
    for i, m in enumerate(messages):
        role = m.get("role")
        if role in ("system", "developer") or i == last_user:
            continue
        if role == "tool" and units and units[-1] and messages[units[-1][0]].get("role") == "assistant":
            units[-1].append(i)
        else:
            units.append([i])
    # The newest unit (the request's own last step) stays, and so does anything after the last user turn
    # that the model must answer now.
    if units and units[-1][-1] == len(messages) - 1:
        units.pop()
    return units


def drop_oldest(messages: Sequence[dict[str, Any]], tokens_over: int,
                tokens_of: Callable[[int], int]) -> tuple[list[dict[str, Any]], list[int]]:
    """Drop the oldest history units until about `tokens_over` tokens are gone.

    `tokens_of(i)` estimates message i's tokens. Returns the kept messages and the dropped
    indexes (in order). The caller renders again and calls once more if still over.
    """
    dropped: list[int] = []
    freed = 0
    for unit in drop_units(messages):
        if freed >= tokens_over:
            break
        dropped.extend(unit)
        freed += sum(tokens_of(i) for i in unit)
    gone = set(dropped)
    return [m for i, m in enumerate(messages) if i not in gone], dropped
