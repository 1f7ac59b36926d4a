"""The demo model's accuracy on held-out questions: greedy answers through the chat template, the tool run between the
two turns as an agent runs it (plugins/demo_model/train.py records it; `train --check` compares)."""
from __future__ import annotations

import json
import random
from typing import Any

from modelcall.plugins.demo_model import corpus
from modelcall.plugins.demo_model.rows import render
from modelcall.plugins.demo_model.tools import calculator, evaluate, format_number, weather_of


def measure(model_dir: str, *, threads: int = 1, n: int = 40) -> dict[str, Any]:
    """Greedy answers on held-out questions, the tool run between the two turns as an agent runs it:
    arithmetic (held-out expressions, both languages), weather (every city, both languages)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rng = random.Random(7)
    tools = corpus.served_tools()
    arith_ok = 0
    for i, e in enumerate(corpus.held_out(n)):
        q = rng.choice(corpus.ARITH_EN if i % 2 == 0 else corpus.ARITH_ZH).format(e=e)
        arith_ok += arithmetic_correct(tok, model, tools, q, e)
    weather_ok, cities = 0, 0
    for en, zh in corpus.CITIES:
        for name, lang in ((en, "en"), (zh, "zh")):
            q = rng.choice(corpus.WEATHER_EN if lang == "en" else corpus.WEATHER_ZH).format(c=name)
            weather_ok += weather_correct(tok, model, tools, q, name)
            cities += 1
    return {"arithmetic_held_out": {"asked": n, "correct": arith_ok},
            "weather": {"asked": cities, "correct": weather_ok}}


def _generate(tok: Any, model: Any, messages: list[dict], tools: list[dict], max_new: int = 64) -> str:
    import torch
    ids = tok(render(tok, messages, tools, gen=True), add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new, do_sample=False)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def parse_call(text: str) -> dict[str, Any] | None:
    if "<tool_call>" not in text or "</tool_call>" not in text:
        return None
    body = text.split("<tool_call>", 1)[1].split("</tool_call>", 1)[0]
    try:
        call = json.loads(body)
        return call if isinstance(call, dict) and isinstance(call.get("arguments"), dict) else None
    except ValueError:
        return None


def arithmetic_correct(tok: Any, model: Any, tools: list[dict], question: str, expression: str) -> bool:
    msgs: list[dict] = [{"role": "user", "content": question}]
    call = parse_call(_generate(tok, model, msgs, tools))
    if not call or call.get("name") != "calculator":
        return False
    try:
        result = calculator(str(call["arguments"].get("expression", "")))
    except ValueError:
        return False
    msgs += [{"role": "assistant", "content": "", "tool_calls": [corpus._call("calculator", call["arguments"])]},
             {"role": "tool", "tool_call_id": "call_0_0", "content": result}]
    answer = _generate(tok, model, msgs, tools)
    return result == format_number(evaluate(expression)) and result in answer


def weather_correct(tok: Any, model: Any, tools: list[dict], question: str, city: str) -> bool:
    msgs: list[dict] = [{"role": "user", "content": question}]
    call = parse_call(_generate(tok, model, msgs, tools))
    if not call or call.get("name") != "get_weather" or call["arguments"].get("city") != city:
        return False
    report = weather_of(city)
    msgs += [{"role": "assistant", "content": "", "tool_calls": [corpus._call("get_weather", call["arguments"])]},
             {"role": "tool", "tool_call_id": "call_0_0", "content": json.dumps(report, ensure_ascii=False)}]
    return f"{report['temperature_c']}°C" in _generate(tok, model, msgs, tools)
