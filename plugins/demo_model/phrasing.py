"""Questions phrased the way people phrase them, for the demo model's training set: templates crossed with
paraphrase rules (a lead-in, the question's core, a time, an ending), numbers as digits or words, the
operation as a symbol or a word, in English, Chinese or a mix of both. The model's reply never varies
with the phrasing: the call always holds digits and " + ", " - ", " * ", " / "."""
from __future__ import annotations

import random

from modelcall.plugins.demo_model.numbers import chinese, english

OP_WORDS_EN = {"+": ["plus", "+", "+", "and"], "-": ["minus", "-", "-", "less"],
               "*": ["times", "*", "*", "x", "×", "multiplied by"], "/": ["divided by", "/", "/", "÷", "over"]}
OP_WORDS_ZH = {"+": ["加", "加上", "+"], "-": ["减", "减去", "-"], "*": ["乘", "乘以", "×", "*"], "/": ["除以", "/", "÷"]}
# the operation named by a verb or a noun; "{a}" and "{b}" are the expression's operands in order
VERB_EN = {"+": ["add {a} and {b}", "add {b} to {a}", "the sum of {a} and {b}"],
           "-": ["subtract {b} from {a}", "take {b} away from {a}", "the difference between {a} and {b}"],
           "*": ["multiply {a} by {b}", "the product of {a} and {b}", "{a} lots of {b}"],
           "/": ["divide {a} by {b}", "{a} split into {b} parts"]}
VERB_ZH = {"+": ["{a}和{b}的和", "{a}与{b}相加"], "-": ["{a}和{b}的差", "从{a}里减去{b}"],
           "*": ["{a}和{b}的积", "{a}与{b}相乘"], "/": ["{a}平均分成{b}份"]}

LEAD_EN = ["", "", "", "Hey, ", "Hi! ", "Quick question: ", "Please, ", "OK, ", "So ", "Hello, ", "Excuse me, "]
ASK_EN = ["what is {x}", "what's {x}", "how much is {x}", "what does {x} make", "what does {x} come to",
          "what is the answer to {x}", "do you know what {x} is", "can you tell me what {x} is",
          "could you tell me what {x} equals", "what will {x} give", "how much do you get for {x}", "{x}"]
DO_EN = ["calculate {x}", "compute {x}", "work out {x}", "solve {x}", "figure out {x}", "tell me {x}",
         "give me {x}", "evaluate {x}", "do {x}", "find {x}"]
POLITE_EN = ["", "", "please ", "can you ", "could you ", "would you ", "I need you to ", "help me "]
TAIL_EN = ["?", "?", ".", "", " please?", ", please.", " for me?", " quickly?", "? thanks", " = ?", "=?"]
ASK_ZH = ["{x}等于多少", "{x}是多少", "{x}得多少", "{x}等于几", "{x}等于", "{x}=", "{x}的结果是多少", "{x}结果是什么",
          "计算{x}", "算一下{x}", "算算{x}", "帮我算{x}", "帮我算一下{x}", "请问{x}等于多少", "请计算{x}", "你知道{x}等于多少吗",
          "{x}", "求{x}"]
TAIL_ZH = ["？", "？", "。", "", "?", "呢？", "啊？", "，谢谢", "吗？"]

LEAD_WEATHER_EN = ["", "", "", "Hey, ", "Hi, ", "Quick question: ", "So ", "Hello! ", "Good morning, "]
ASK_WEATHER_EN = ["what's the weather in {c}", "what is the weather like in {c}", "how's the weather in {c}",
                  "how is the weather in {c}", "weather in {c}", "{c} weather", "weather for {c}",
                  "what's the temperature in {c}", "how hot is it in {c}", "how cold is it in {c}",
                  "how warm is it in {c}", "is it raining in {c}", "is it sunny in {c}", "is it snowing in {c}",
                  "is it cold in {c}", "is it hot in {c}", "is it windy in {c}", "do I need an umbrella in {c}",
                  "do I need a coat in {c}", "what's it like in {c}", "what are the conditions in {c}",
                  "what's the forecast for {c}", "how many degrees is it in {c}", "any rain in {c}",
                  "what is the current weather in {c}", "temperature in {c}", "{c} temperature"]
DO_WEATHER_EN = ["check the weather in {c}", "tell me the weather in {c}", "look up the weather for {c}",
                 "give me the weather in {c}", "get the weather for {c}", "find the temperature in {c}",
                 "show me the weather in {c}"]
WHEN_EN = ["", "", "", " today", " right now", " now", " this morning", " tonight", " at the moment", " currently"]
ASK_WEATHER_ZH = ["{c}的天气怎么样", "{c}天气怎么样", "{c}天气如何", "{c}的天气如何", "{c}天气", "{c}的天气",
                  "{c}多少度", "{c}气温多少", "{c}的气温是多少", "{c}气温", "{c}热不热", "{c}冷不冷", "{c}热吗", "{c}冷吗",
                  "{c}下雨了吗", "{c}下雨吗", "{c}下雪了吗", "{c}需要带伞吗", "{c}要穿外套吗", "{c}天气好吗",
                  "{c}那边天气怎么样", "{c}是晴天吗", "{c}刮风吗", "查一下{c}的天气", "查查{c}天气", "请问{c}的天气",
                  "告诉我{c}的天气", "我想知道{c}的天气", "帮我看看{c}的天气", "{c}现在什么天气"]
WHEN_ZH = ["", "", "", "今天", "现在", "此刻", "目前"]
# questions that are a noun phrase: a capitalized word before "in {c}" that is not the city
NOUN_WEATHER_EN = ["current conditions in {c}", "weather now in {c}", "today's weather in {c}",
                   "current temperature in {c}", "latest weather for {c}", "live weather in {c}",
                   "weather update for {c}", "outside temperature in {c}", "tonight's weather in {c}",
                   "temperatures today in {c}", "rain forecast for {c}", "weather conditions in {c} today"]


def number_text(n: str, lang: str, rng: random.Random) -> str:
    """An operand as the question writes it: its digits, or (a whole number below 10,000, sometimes)
    its words in the question's language."""
    if not n.isdigit() or int(n) >= 10000 or rng.random() < 0.6:
        return n
    return english(int(n), rng) if lang == "en" else chinese(int(n), rng)


def numbers_text(a: str, b: str, lang: str, rng: random.Random) -> tuple[str, str]:
    """Both operands as one person writes them in one question: both in digits, both in words ("fifty minus
    seventeen", "三百加两百"; a compound of tens hyphenated or spaced), or now and then one of each."""
    r = rng.random()
    words = (False, False) if r < 0.35 else (True, True) if r < 0.9 else rng.choice([(True, False), (False, True)])

    def text(n: str, in_words: bool) -> str:
        if not in_words or not n.isdigit() or int(n) >= 10000:
            return n
        return english(int(n), rng, spaced=0.35) if lang == "en" else chinese(int(n), rng)
    return text(a, words[0]), text(b, words[1])


def arithmetic_question(rng: random.Random, a: str, op: str, b: str, lang: str, mixed: bool = False,
                        extended: bool = False) -> str:
    """A question asking for `a op b` in `lang`; `mixed`: the operation (or the request) in the other language;
    `extended`: the operands written together (numbers_text) rather than each on its own."""
    op_lang = ("zh" if lang == "en" else "en") if mixed else lang
    if extended:
        x_a, x_b = numbers_text(a, b, lang, rng)
    else:
        x_a, x_b = number_text(a, lang, rng), number_text(b, lang, rng)
    if not mixed and rng.random() < 0.15:   # the operation named by a verb or a noun
        x = rng.choice(VERB_EN[op] if lang == "en" else VERB_ZH[op]).format(a=x_a, b=x_b)
        if lang == "en":
            return _finish_en(rng, rng.choice(["what is {x}", "what's {x}", "{x}", "please {x}", "can you {x}",
                                               "now {x}"]).format(x=x), LEAD_EN, TAIL_EN[:8])
        return _finish_zh(rng, rng.choice(ASK_ZH).format(x=x))
    word = rng.choice(OP_WORDS_EN[op] if op_lang == "en" else OP_WORDS_ZH[op])
    spaced = op_lang == "en" and (any(c.isalpha() for c in word) or rng.random() < 0.85) or op_lang == "zh" and rng.random() < 0.3
    x = f"{x_a} {word} {x_b}" if spaced or mixed else f"{x_a}{word}{x_b}"
    if lang == "en":
        return _finish_en(rng, _en_core(rng, x), LEAD_EN, TAIL_EN)
    if mixed and rng.random() < 0.3:   # a Chinese request around an English verb
        return _finish_zh(rng, rng.choice(["帮我 ", "请 ", "麻烦 ", ""]) + rng.choice(DO_EN).format(x=x))
    return _finish_zh(rng, rng.choice(ASK_ZH).format(x=x + (" " if mixed else "")))


def symbolic_question(rng: random.Random, expression: str, lang: str) -> str:
    """A question holding the expression as written (symbols, parentheses, decimals)."""
    x = expression if rng.random() < 0.8 else expression.replace(" ", "")
    if lang == "en":
        return _finish_en(rng, _en_core(rng, x), LEAD_EN, TAIL_EN)
    return _finish_zh(rng, rng.choice(ASK_ZH).format(x=x))


def weather_question(rng: random.Random, city: str, lang: str, extended: bool = False) -> str:
    """A question about the weather in `city`, in `lang` (the city may be written in the other language);
    `extended`: some English questions are a bare noun phrase whose first word is capitalized like a name."""
    if extended and lang == "en" and rng.random() < 0.2:
        return _finish_en(rng, rng.choice(NOUN_WEATHER_EN).format(c=city), [""], TAIL_EN[:8])
    if lang == "en":
        if rng.random() < 0.25:
            core = rng.choice(POLITE_EN) + rng.choice(DO_WEATHER_EN)
        else:
            core = rng.choice(ASK_WEATHER_EN)
        return _finish_en(rng, core.format(c=city) + rng.choice(WHEN_EN), LEAD_WEATHER_EN, TAIL_EN[:8])
    when = rng.choice(WHEN_ZH)
    core = rng.choice(ASK_WEATHER_ZH)
    core = core.replace("{c}", "{c}" + when, 1) if core.startswith("{c}") else core
    if city[:1].isascii() and rng.random() < 0.3:
        core = core.replace("{c}", "{c} ", 1)   # people leave a space after a Latin name
    return _finish_zh(rng, core.format(c=city))


def mixed_weather_question(rng: random.Random, city: str) -> str:
    """An English frame around a Chinese word or the reverse: 天气 in X, X的weather, X weather 怎么样."""
    return rng.choice(["天气 in {c}?", "{c}的weather?", "{c} weather 怎么样？", "weather {c} 今天？", "{c}天气 please",
                       "what's {c}的天气?", "{c} 今天 weather?", "查 {c} weather"]).format(c=city)


def _en_core(rng: random.Random, x: str) -> str:
    if rng.random() < 0.3:
        return rng.choice(POLITE_EN) + rng.choice(DO_EN).format(x=x)
    return rng.choice(ASK_EN).format(x=x)


def _finish_en(rng: random.Random, core: str, leads: list[str], tails: list[str]) -> str:
    lead = rng.choice(leads)
    text = lead + core
    if rng.random() < 0.8:   # most people capitalize the first word; some never do
        text = text[:1].upper() + text[1:]
    return text + rng.choice(tails)


def _finish_zh(rng: random.Random, core: str) -> str:
    # a question already closed by a particle takes no second one
    return core + rng.choice(TAIL_ZH[:4] if core.endswith(("吗", "呢", "啊")) else TAIL_ZH)
