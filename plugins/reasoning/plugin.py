"""Registers the built-in reasoning parsers. One is picked per model by `plugin_config["reasoning"]
["parser"]`, else by markers in its chat template (all markers of a parser must appear).

- `think`: `<think>…</think>` blocks wherever the output writes them; the output starts inside a
  block when the prompt left one open.
- `think_in_prompt`: the template opens the block in the generation prompt (DeepSeek-R1, QwQ), so the
  output is reasoning until `</think>`, unless the prompt closed the block itself.
- `qwen3`: `think`, with the `enable_thinking` switch of the template (false: no reasoning split;
  Anthropic's `thinking: disabled` sets it).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from modelcall.core.hookspecs import hookimpl
from modelcall.plugins.reasoning.think import ThinkParser, opened_in_prompt, tag_ids


def think(tokenizer: Any, prompt_token_ids: Sequence[int]) -> ThinkParser:
    start, end = tag_ids(tokenizer)
    return ThinkParser(start, end, inside=bool(opened_in_prompt(tokenizer, prompt_token_ids, start, end)))


def think_in_prompt(tokenizer: Any, prompt_token_ids: Sequence[int]) -> ThinkParser:
    start, end = tag_ids(tokenizer)
    return ThinkParser(start, end, inside=opened_in_prompt(tokenizer, prompt_token_ids, start, end) is not False)


def qwen3(tokenizer: Any, prompt_token_ids: Sequence[int], chat_template_kwargs: dict) -> ThinkParser | None:
    if chat_template_kwargs.get("enable_thinking") is False:
        return None
    return think(tokenizer, prompt_token_ids)


@hookimpl(trylast=True)
def register_reasoning_parsers(register) -> None:  # noqa: ANN001 - the host's register callable
    register("qwen3", qwen3, markers=("<think>", "enable_thinking"))
    register("think", think, markers=("<think>", "</think>"))
    register("think_in_prompt", think_in_prompt, markers=())
