"""The demo model's accuracy on held-out questions: greedy answers through the chat template, the tool run between the
two turns as an agent runs it (plugins/demo_model/train.py records it; `train --check` compares)."""
from __future__ import annotations

import json
import random
from typing import Any

from modelcall.plugins.demo_model import corpus, evalset
from modelcall.plugins.demo_model.rows import render
from modelcall.plugins.demo_model.tools import TOOLS, calculator, evaluate, format_number, weather_of


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
    asked: list[tuple[str, str, str]] = []  # (tool expected, question, expression or city)
    for i, e in enumerate(corpus.held_out(n)):
        asked.append(("calculator", rng.choice(corpus.ARITH_EN if i % 2 == 0 else corpus.ARITH_ZH).format(e=e), e))
    for en, zh in corpus.CITIES:
        for name, lang in ((en, "en"), (zh, "zh")):
            asked.append(("get_weather", rng.choice(corpus.WEATHER_EN if lang == "en" else corpus.WEATHER_ZH)
                          .format(c=name), name))
    # Every question's first turn in one batch, then every second turn whose call was valid in another.
    chats = [[{"role": "user", "content": q}] for _, q, _ in asked]
    calls = [parse_call(t) for t in generate_all(tok, model, chats, tools)]
    seconds: dict[int, tuple[list[dict], str]] = {}  # question -> (second turn's chat, what its answer must contain)
    for k, ((name, _, subject), call) in enumerate(zip(asked, calls)):
        turn = tool_turn(name, subject, call)
        if turn is not None:
            seconds[k] = (chats[k] + [
                {"role": "assistant", "content": "", "tool_calls": [corpus._call(name, call["arguments"])]},
                {"role": "tool", "tool_call_id": "call_0_0", "content": turn[0]}], turn[1])
    answers = dict(zip(seconds, generate_all(tok, model, [c for c, _ in seconds.values()], tools)))
    correct = [k in answers and seconds[k][1] in answers[k] for k in range(len(asked))]
    return {"arithmetic_held_out": {"asked": n, "correct": sum(correct[:n])},
            "weather": {"asked": len(asked) - n, "correct": sum(correct[n:])}}


def measure_eval(model_dir: str, *, threads: int = 1) -> dict[str, Any]:
    """The hand-written split (evalset) scored greedily as the agent runs it: evalset.summary's figures."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return evalset.summary(*measure_split(tok, model))


def measure_split(tok: Any, model: Any, rows: list[dict[str, Any]] | None = None) -> tuple[list, list]:
    """The hand-written split (evalset) answered greedily as `modelcall agent` runs a task: the first
    turn; a call run by the tool itself and fed back; the second turn, whose text is the answer (a
    second call there is a second call, which the judge counts wrong). Returns (rows, verdicts)."""
    rows = evalset.load() if rows is None else rows
    tools = corpus.served_tools()
    chats = [[{"role": "user", "content": r["question"]}] for r in rows]
    firsts = generate_all(tok, model, chats, tools, max_new=80)
    calls: dict[int, list[evalset.Call]] = {}
    seconds: dict[int, list[dict]] = {}
    for k, text in enumerate(firsts):
        call = parse_call(text)
        if call is None:
            continue
        arguments = json.dumps(call["arguments"], ensure_ascii=False)
        status, result = run_tool(call)
        calls[k] = [evalset.Call(str(call.get("name")), arguments, status, result)]
        seconds[k] = chats[k] + [
            {"role": "assistant", "content": "", "tool_calls": [corpus._call(str(call.get("name")), call["arguments"])]},
            {"role": "tool", "tool_call_id": "call_0_0", "content": result}]
    answers = dict(zip(seconds, generate_all(tok, model, list(seconds.values()), tools, max_new=80)))
    verdicts = []
    for k, row in enumerate(rows):
        text = answers.get(k, firsts[k])
        # a call in the answer turn is a second call; a first turn with a call that does not parse is no answer
        more = [evalset.Call("?", "", "?", "")] if k in answers and "<tool_call>" in text else []
        answer = None if "<tool_call>" in text else text.split("</think>", 1)[-1].strip()
        verdicts.append(evalset.judge(row, calls.get(k, []) + more, answer, "answered"))
    return rows, verdicts


def run_tool(call: dict[str, Any]) -> tuple[str, str]:
    """(status, result) of a parsed call, as the agent runs it: the tool by name, its failure fed back."""
    tool = {t.name: t for t in TOOLS}.get(str(call.get("name")))
    if tool is None:
        return "unknown_tool", f"there is no tool {call.get('name')!r}"
    try:
        value = tool.fn(**call["arguments"])
    except (TypeError, ValueError) as e:
        return "failed", f"{tool.name} failed: {e}"
    return "ok", value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def tool_turn(name: str, subject: str, call: dict[str, Any] | None) -> tuple[str, str] | None:
    """The tool's result for a first turn's call and the text the answer must contain, or None when the call is
    wrong (another tool, another city, an expression the calculator refuses, a result that is not the question's)."""
    if not call or call.get("name") != name:
        return None
    if name == "calculator":
        try:
            result = calculator(str(call["arguments"].get("expression", "")))
        except ValueError:
            return None
        return (result, result) if result == format_number(evaluate(subject)) else None
    if call["arguments"].get("city") != subject:
        return None
    report = weather_of(subject)
    return json.dumps(report, ensure_ascii=False), f"{report['temperature_c']}°C"


def generate_all(tok: Any, model: Any, chats: list[list[dict]], tools: list[dict], max_new: int = 64) -> list[str]:
    """Greedy answers to many chats at once: left-padded in one batch, each row stopping at an end token of the
    generation config or after max_new tokens, as `model.generate(..., do_sample=False)` decodes a batch."""
    import torch
    from transformers import DynamicCache
    rows = [tok(render(tok, c, tools, gen=True), add_special_tokens=False).input_ids for c in chats]
    if not rows:
        return []
    width = max(map(len, rows))
    pad = model.generation_config.pad_token_id
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    ends = model.generation_config.eos_token_id
    ends = torch.tensor(ends if isinstance(ends, list) else [ends])
    cache = DynamicCache(config=model.config)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    step = ids
    out: list[torch.Tensor] = []
    done = torch.zeros(len(rows), dtype=torch.bool)
    with torch.no_grad():
        while len(out) < max_new and not bool(done.all()):
            logits = model(input_ids=step, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
                           logits_to_keep=1).logits
            token = torch.where(done, pad, logits[:, -1].argmax(-1))
            out.append(token)
            done |= torch.isin(token, ends)
            step = token[:, None]
            mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=mask.dtype)], dim=1)
            positions = positions[:, -1:] + 1
    new = torch.stack(out, dim=1).tolist()
    return [tok.decode(r, skip_special_tokens=True) for r in new]


def parse_call(text: str) -> dict[str, Any] | None:
    if "<tool_call>" not in text or "</tool_call>" not in text:
        return None
    body = text.split("<tool_call>", 1)[1].split("</tool_call>", 1)[0]
    try:
        call = json.loads(body)
        return call if isinstance(call, dict) and isinstance(call.get("arguments"), dict) else None
    except ValueError:
        return None
