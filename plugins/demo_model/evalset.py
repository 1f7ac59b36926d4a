"""The hand-written evaluation split of the trained demo model (eval_questions.jsonl, issue 45): questions
written as people write them, apart from the training generator, each with what counts as right, and the
judge that scores one agent task against it (used by measure.py and the tests alike).

A row: {"kind", "question", "tool": "calculator" | "get_weather" | null, and "expression" + "result" or "city"}.
Right means:
- calculator: exactly one call, to the calculator, whose result is the expected result, and an answer that
  contains that result as the tool wrote it;
- get_weather: exactly one call, to get_weather, for the city asked (case and spaces aside), and an answer
  that contains the report's temperature as `N°C`;
- no tool: no call, and an answer that is not empty.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from modelcall.plugins.demo_model.tools import weather_of

EVAL_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "eval_questions.jsonl")


def load(path: str = EVAL_FILE) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def banned_for_training(path: str = EVAL_FILE) -> tuple[set[str], set[str]]:
    """(expressions, cities casefolded) of the split: the training generator never asks for either."""
    rows = load(path)
    return ({r["expression"] for r in rows if r["tool"] == "calculator"},
            {r["city"].casefold() for r in rows if r["tool"] == "get_weather"})


@dataclass(frozen=True)
class Call:
    """One tool call of a task as the agent ran it."""
    name: str
    arguments: str      # the model's JSON text
    status: str         # the agent's outcome: ok, invalid, failed, ...
    result: str


@dataclass(frozen=True)
class Verdict:
    right: bool
    called: str | None       # the first tool called, or None
    copied: bool | None      # a tool ran: did the answer hold its result exactly (None: no tool ran)


def copied_text(call: Call) -> str | None:
    """What an answer must copy from a call that ran: the calculator's result, the report's `N°C`."""
    if call.status != "ok":
        return None
    if call.name == "calculator":
        return call.result
    if call.name == "get_weather":
        try:
            return f"{json.loads(call.result)['temperature_c']}°C"
        except (ValueError, KeyError, TypeError):
            return None
    return None


def judge(row: dict[str, Any], calls: list[Call], answer: str | None, status: str) -> Verdict:
    answered = status == "answered" and bool((answer or "").strip())
    copy = copied_text(calls[0]) if calls else None
    copied = None if copy is None else copy in (answer or "")
    called = calls[0].name if calls else None
    if row["tool"] is None:
        return Verdict(answered and not calls, called, copied)
    if len(calls) != 1 or called != row["tool"] or not answered or not copied:
        return Verdict(False, called, copied)
    if row["tool"] == "calculator":
        return Verdict(calls[0].result == row["result"], called, copied)
    try:
        city = json.loads(calls[0].arguments).get("city", "")
    except (ValueError, AttributeError):
        return Verdict(False, called, copied)
    same = " ".join(str(city).split()).casefold() == row["city"].casefold()
    return Verdict(same and copy == f"{weather_of(row['city'])['temperature_c']}°C", called, copied)


def summary(rows: list[dict[str, Any]], verdicts: list[Verdict]) -> dict[str, Any]:
    """Accuracy overall and by kind, the tool vs no-tool confusion, and the copy rate of tool results."""
    by_kind: dict[str, list[int]] = {}
    confusion: dict[str, dict[str, int]] = {}
    for row, v in zip(rows, verdicts):
        k = by_kind.setdefault(row["kind"], [0, 0])
        k[0] += v.right
        k[1] += 1
        want = row["tool"] or "none"
        got = v.called or "none"
        confusion.setdefault(want, {}).setdefault(got, 0)
        confusion[want][got] += 1
    ran = [v.copied for v in verdicts if v.copied is not None]
    return {"asked": len(rows), "correct": sum(v.right for v in verdicts),
            "by_kind": {k: f"{r}/{n}" for k, (r, n) in sorted(by_kind.items())},
            "confusion": {w: dict(sorted(g.items())) for w, g in sorted(confusion.items())},
            "tool_results_copied": f"{sum(ran)}/{len(ran)}"}
