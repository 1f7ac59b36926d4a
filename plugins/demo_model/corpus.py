"""The trained demo model's synthetic corpus: chats in the demo chat template's format, strictly
formatted so a tiny model learns them in minutes on a CPU.

- arithmetic: the question → a short `<think>` → a `calculator` call copying the expression → the
  tool's result → "37 * 91 = 3367.";
- weather: the question → a `get_weather` call with the city asked → the report → a sentence using it;
- short factual answers and greetings, with and without tools offered;
- each in English and in Chinese.

Every chat is a list of messages plus the tools offered in the form the server hands its chat
template for an agent's request (`served_tools`, `_call`): the training prompts are the bytes
`modelcall serve` renders for `modelcall agent --tools ...:calculator ...:get_weather`
(tests/test_trained_demo.py compares them with the server's /tokenize). `held_out()` arithmetic never
appears in training.
"""
from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

from modelcall.plugins.demo_model import phrasing, smalltalk
from modelcall.plugins.demo_model.evalset import banned_for_training
from modelcall.plugins.demo_model.places import REAL_CITIES, made_up_city
from modelcall.plugins.demo_model.tools import TOOLS, calculator, get_weather, weather_of

# (English, Chinese) city names of the original corpus; the training set draws on places.REAL_CITIES and made-up names.
CITIES = REAL_CITIES[:48]

CONDITION_ZH = {"sunny": "晴", "cloudy": "多云", "rainy": "下雨", "windy": "有风", "snowy": "下雪", "foggy": "有雾"}

# (English question, English answer, Chinese question, Chinese answer)
FACTS = [
    ("What is the capital of France?", "The capital of France is Paris.", "法国的首都是哪里？", "法国的首都是巴黎。"),
    ("What is the capital of Japan?", "The capital of Japan is Tokyo.", "日本的首都是哪里？", "日本的首都是东京。"),
    ("What is the capital of China?", "The capital of China is Beijing.", "中国的首都是哪里？", "中国的首都是北京。"),
    ("What is the capital of Italy?", "The capital of Italy is Rome.", "意大利的首都是哪里？", "意大利的首都是罗马。"),
    ("What is the capital of Germany?", "The capital of Germany is Berlin.", "德国的首都是哪里？", "德国的首都是柏林。"),
    ("What is the capital of Spain?", "The capital of Spain is Madrid.", "西班牙的首都是哪里？", "西班牙的首都是马德里。"),
    ("What is the capital of the United Kingdom?", "The capital of the United Kingdom is London.",
     "英国的首都是哪里？", "英国的首都是伦敦。"),
    ("What is the capital of Egypt?", "The capital of Egypt is Cairo.", "埃及的首都是哪里？", "埃及的首都是开罗。"),
    ("How many days are in a week?", "A week has 7 days.", "一个星期有几天？", "一个星期有7天。"),
    ("How many hours are in a day?", "A day has 24 hours.", "一天有多少小时？", "一天有24小时。"),
    ("How many minutes are in an hour?", "An hour has 60 minutes.", "一小时有多少分钟？", "一小时有60分钟。"),
    ("How many months are in a year?", "A year has 12 months.", "一年有几个月？", "一年有12个月。"),
    ("What color is the sky?", "The sky is blue on a clear day.", "天空是什么颜色？", "晴天的天空是蓝色的。"),
    ("What is water made of?", "Water is made of hydrogen and oxygen.", "水是由什么组成的？", "水由氢和氧组成。"),
    ("At what temperature does water boil?", "Water boils at 100°C at sea level.",
     "水在多少度沸腾？", "在海平面，水在100°C沸腾。"),
    ("At what temperature does water freeze?", "Water freezes at 0°C.", "水在多少度结冰？", "水在0°C结冰。"),
    ("What is the largest planet?", "Jupiter is the largest planet in the solar system.",
     "最大的行星是哪个？", "木星是太阳系中最大的行星。"),
    ("What planet do we live on?", "We live on Earth.", "我们住在哪个行星上？", "我们住在地球上。"),
    ("What is the largest ocean?", "The Pacific is the largest ocean.", "最大的海洋是哪个？", "太平洋是最大的海洋。"),
    ("How many legs does a spider have?", "A spider has 8 legs.", "蜘蛛有几条腿？", "蜘蛛有8条腿。"),
    ("How many continents are there?", "There are 7 continents.", "世界上有几个大洲？", "世界上有7个大洲。"),
    ("Who wrote Romeo and Juliet?", "William Shakespeare wrote Romeo and Juliet.",
     "《罗密欧与朱丽叶》是谁写的？", "《罗密欧与朱丽叶》是莎士比亚写的。"),
    ("What is the fastest land animal?", "The cheetah is the fastest land animal.",
     "跑得最快的陆地动物是什么？", "猎豹是跑得最快的陆地动物。"),
    ("What gas do plants take in?", "Plants take in carbon dioxide.", "植物吸收什么气体？", "植物吸收二氧化碳。"),
    ("What is modelcall?", "modelcall is an engine that serves language models over an OpenAI-compatible API.",
     "modelcall是什么？", "modelcall是一个通过OpenAI兼容接口提供语言模型服务的引擎。"),
    ("Who are you?", "I am the modelcall demo model. I can do arithmetic with a calculator and look up the weather.",
     "你是谁？", "我是modelcall的演示模型。我可以用计算器做算术，也可以查天气。"),
    ("Hello!", "Hello! Ask me to calculate something or about the weather in a city.",
     "你好！", "你好！你可以让我算数，或者问我某个城市的天气。"),
    ("What can you do?", "I can do arithmetic with a calculator, look up the weather and answer simple questions.",
     "你能做什么？", "我可以用计算器做算术、查天气，也能回答简单的问题。"),
    ("Thank you!", "You are welcome!", "谢谢！", "不客气！"),
]

ARITH_EN = ["What is {e}?", "What's {e}?", "Calculate {e}.", "Compute {e}.", "How much is {e}?",
            "Please work out {e}.", "What does {e} equal?", "Can you calculate {e}?"]
ARITH_ZH = ["{e} 等于多少？", "计算 {e}。", "{e} 是多少？", "请算一下 {e}。", "帮我算 {e}。"]
WEATHER_EN = ["What's the weather in {c}?", "What is the weather in {c}?", "How is the weather in {c}?",
              "What's the weather like in {c} today?", "Weather in {c}?", "Is it cold in {c}?",
              "What is the temperature in {c}?", "Tell me the weather in {c}."]
WEATHER_ZH = ["{c}的天气怎么样？", "{c}今天天气如何？", "{c}现在多少度？", "{c}天气怎么样？", "查一下{c}的天气。"]
THINK_ARITH = {"en": "This is arithmetic: I use the calculator.", "zh": "这是算术题，我用计算器。"}
OPS = ["+", "-", "*", "/"]


def held_out(n: int = 40, seed: int = 1919) -> list[str]:
    """Arithmetic expressions kept out of training: the accuracy is measured on these."""
    rng = random.Random(seed)
    return [_expression(rng) for _ in range(n)]


def _expression(rng: random.Random) -> str:
    op = rng.choice(OPS)
    if op == "/":
        b = rng.randint(2, 99)
        a = b * rng.randint(2, 99) if rng.random() < 0.7 else rng.randint(10, 999)
    else:
        a, b = rng.randint(2, 999), rng.randint(2, 999)
    return f"{a} {op} {b}"


def served_tools() -> list[dict[str, Any]]:
    """The agent's tools (`Tool.openai()`, calculator then get_weather) as the server passes them to
    the template: decoded into its request struct and back, so `function` comes first, `type` last."""
    return [{"function": {"name": t.name, "description": t.description, "parameters": t.parameters},
             "type": "function"} for t in TOOLS]


def _call(tool_name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    # As the server hands the template an agent's earlier call: the arguments parsed back to an object
    # (the agent's id for the first call of turn 0 is call_0_0).
    return {"id": "call_0_0", "type": "function", "function": {"name": tool_name, "arguments": arguments}}


def _tools(rng: random.Random, needed: Any | None) -> list[dict[str, Any]] | None:
    # A tool chat always offers what the agent offers; a plain question sometimes offers nothing.
    if needed is None and rng.random() < 0.2:
        return None
    return served_tools()


def arithmetic_chat(rng: random.Random, expression: str, lang: str, question: str | None = None) -> dict[str, Any]:
    """question (ARITH_EN/ARITH_ZH around the expression when not given) → think → calculator call with the
    expression → its result → "expression = result." """
    if question is None:
        question = rng.choice(ARITH_EN if lang == "en" else ARITH_ZH).format(e=expression)
    result = calculator(expression)
    answer = f"{expression} = {result}" + ("." if lang == "en" else "。")
    return {"tools": _tools(rng, calculator), "messages": [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "", "reasoning_content": THINK_ARITH[lang],
         "tool_calls": [_call("calculator", {"expression": expression})]},
        {"role": "tool", "tool_call_id": "call_0_0", "content": result},
        {"role": "assistant", "content": answer}]}


def weather_chat(rng: random.Random, city: tuple[str, str] | str, lang: str, question: str | None = None,
                 answer_lang: str | None = None) -> dict[str, Any]:
    """question → get_weather call with the city as asked → the report → a sentence from it. `city`: an
    (English, Chinese) pair (the name of `lang` is asked) or one name."""
    name = city if isinstance(city, str) else (city[0] if lang == "en" else city[1])
    if question is None:
        question = rng.choice(WEATHER_EN if lang == "en" else WEATHER_ZH).format(c=name)
    report = weather_of(name)
    t, cond = report["temperature_c"], report["condition"]
    answer = (f"In {name} it is {t}°C and {cond}." if (answer_lang or lang) == "en"
              else f"{name}现在{CONDITION_ZH[cond]}，气温{t}°C。")
    return {"tools": _tools(rng, get_weather), "messages": [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "", "tool_calls": [_call("get_weather", {"city": name})]},
        {"role": "tool", "tool_call_id": "call_0_0", "content": json.dumps(report, ensure_ascii=False)},
        {"role": "assistant", "content": answer}]}


def fact_chat(rng: random.Random, fact: tuple[str, str, str, str], lang: str) -> dict[str, Any]:
    q, a = (fact[0], fact[1]) if lang == "en" else (fact[2], fact[3])
    return plain_chat(rng, q, a)


def plain_chat(rng: random.Random, question: str, answer: str) -> dict[str, Any]:
    return {"tools": _tools(rng, None), "messages": [{"role": "user", "content": question},
                                                    {"role": "assistant", "content": answer}]}


# ---- the training set -----------------------------------------------------------------------------

def _operand(rng: random.Random) -> int:
    r = rng.random()
    return rng.randint(1, 20) if r < 0.3 else rng.randint(2, 99) if r < 0.6 else \
        rng.randint(100, 999) if r < 0.9 else rng.randint(1000, 9999)


def _round_operand(rng: random.Random) -> int:
    # the numbers people pick: 30% of the extended corpus's operands are 10-90, 100-900 or 1000-9000 in round steps
    # (the adapter of stages 1-2 wrote "eighty" as 8 and "three hundred" as 30: the corpus rarely held them)
    if rng.random() < 0.3:
        return rng.randint(1, 9) * rng.choice((10, 10, 100, 100, 1000))
    return _operand(rng)


def _extended_expression(rng: random.Random) -> tuple[str, str, str] | str:
    """The extended corpus's (a, op, b) or (20%) longer expression: round operands, and brackets around either
    side or both."""
    if rng.random() < 0.2:
        a, b, c, d = (rng.randint(1, 99) for _ in range(4))
        o1, o2, o3 = rng.choice(OPS[:3]), rng.choice(OPS), rng.choice(OPS[:3])   # no bracket to divide by: no 0
        return rng.choice([f"({a} {o1} {b}) {o2} {c}", f"({a} {o1} {b}) {o2} {c}", f"{a} {o1} ({b} {o2} {c})",
                           f"({a} {o3} {b}) {o1} ({c} {o3} {d})", f"{a} {o1} {b} {o2} {c}"])
    op = rng.choice(OPS)
    if op == "/":
        b = rng.choice((2, 3, 4, 5, 6, 8, 10, 12, 20, 25)) if rng.random() < 0.5 else max(2, _operand(rng) % 100)
        return str(b * _round_operand(rng) if rng.random() < 0.5 else _round_operand(rng)), op, str(b)
    return str(_round_operand(rng)), op, str(_round_operand(rng))


def _training_expression(rng: random.Random) -> tuple[str, str, str] | str:
    """(a, op, b) for a question in words or symbols, or (8%) a longer expression written in symbols."""
    if rng.random() < 0.08:
        a, b, c = _operand(rng), rng.randint(1, 99), rng.randint(1, 99)
        o1, o2 = rng.choice(OPS[:3]), rng.choice(OPS[:3])
        return rng.choice([f"{a} {o1} {b} {o2} {c}", f"({a} {o1} {b}) {o2} {c}", f"{a} {o1} ({b} {o2} {c})"])
    op = rng.choice(OPS)
    if rng.random() < 0.05:   # a decimal operand
        return f"{rng.randint(0, 99)}.{rng.randint(1, 9)}", op, str(rng.randint(2, 20))
    b = _operand(rng)
    if op == "/":
        b = max(2, b % 100)
        a = b * _operand(rng) if rng.random() < 0.7 else _operand(rng)
    else:
        a = _operand(rng)
    return str(a), op, str(b)


def _arithmetic(rng: random.Random, lang: str, banned: set[str], extended: bool = False) -> dict[str, Any]:
    while True:
        parts = _extended_expression(rng) if extended else _training_expression(rng)
        expression = parts if isinstance(parts, str) else " ".join(parts)
        if expression not in banned:
            break
    mixed = rng.random() < 0.1
    if isinstance(parts, str) or rng.random() < 0.15:
        question = phrasing.symbolic_question(rng, expression, lang)
    else:
        question = phrasing.arithmetic_question(rng, *parts, lang, mixed=mixed, extended=extended)
    return arithmetic_chat(rng, expression, lang, question)


def _chinese_numerals(rng: random.Random, banned: set[str]) -> dict[str, Any]:
    """(extended rules) A question in Chinese with its numbers as Chinese numerals (phrasing.chinese_numeral_question):
    the adapter read 五十 as 5 and 三百 as 3 when the rules wrote English number words far more often."""
    while True:
        op = rng.choice(OPS)
        a, b = phrasing.chinese_numeral(rng), phrasing.chinese_numeral(rng)
        if op == "/":
            b = rng.choice((2, 3, 4, 5, 6, 8, 10, 12, 20, 25, 50, 100)) if rng.random() < 0.6 else max(2, b % 100)
            a = b * phrasing.chinese_numeral(rng) if rng.random() < 0.7 else a
            if a >= 10000:
                continue
        expression = f"{a} {op} {b}"
        if expression not in banned:
            return arithmetic_chat(rng, expression, "zh", phrasing.chinese_numeral_question(rng, a, op, b))


def _city(rng: random.Random, lang: str, banned: set[str], extended: bool = False) -> str:
    while True:
        if rng.random() < 0.45:
            pair = rng.choice(REAL_CITIES)
            name = pair[0] if (lang == "en") != (rng.random() < 0.1) else pair[1]
        else:
            name = made_up_city(rng, lang if rng.random() < 0.9 else ("zh" if lang == "en" else "en"), extended)
        if name.casefold() not in banned:
            return name


def _weather(rng: random.Random, lang: str, banned: set[str], extended: bool = False) -> dict[str, Any]:
    name = _city(rng, lang, banned, extended)
    if rng.random() < 0.08:
        return weather_chat(rng, name, lang, phrasing.mixed_weather_question(rng, name))
    return weather_chat(rng, name, lang, phrasing.weather_question(rng, name, lang, extended))


def _no_tool(rng: random.Random, lang: str) -> dict[str, Any]:
    if rng.random() < 0.35:
        return fact_chat(rng, rng.choice(FACTS), lang)
    question, reply = rng.choice(smalltalk.EN if lang == "en" else smalltalk.ZH)
    return plain_chat(rng, question, reply or smalltalk.FALLBACK[lang])


def chats(n: int, seed: int = 0, extended: bool = False) -> Iterator[dict[str, Any]]:
    """`n` training chats, the same for the same seed: arithmetic (42%), weather (38%), no tool (20%), in
    English (60%) or Chinese; no held_out() expression and no expression or city of the evaluation split.
    `extended`: the paraphrase rules added for the agent adapter's third stage -- round operands, a question's
    numbers all in words or all in digits, compounds of tens spaced or hyphenated, bracketed expressions,
    multi-word, hyphenated and longer made-up cities (Han names often ending in a character that also starts ordinary
    text), weather asked as a noun phrase, as yes/no or "what's it like outside", and (10% of chats) Chinese
    questions whose numbers are Chinese numerals (without it the stream is the one earlier stages and the tiny model
    were trained on)."""
    rng = random.Random(seed)
    eval_expressions, eval_cities = banned_for_training()
    banned = set(held_out()) | eval_expressions
    for _ in range(n):
        lang = "en" if rng.random() < 0.6 else "zh"
        kind = rng.random()
        if extended and rng.random() < 0.1:
            yield _chinese_numerals(rng, banned)
        elif kind < 0.42:
            yield _arithmetic(rng, lang, banned, extended)
        elif kind < 0.8:
            yield _weather(rng, lang, eval_cities, extended)
        else:
            yield _no_tool(rng, lang)
