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


# yes/no and "what's it like outside" weather questions, crossed: a frame, a condition, a time (extended rules;
# the adapter answered "is it raining in X" and "what's it like outside in X" without a call)
YESNO_FRAME_EN = ["is it {w} in {c}", "is it {w} out in {c}", "is it {w} outside in {c}", "will it be {w} in {c}",
                  "is it going to be {w} in {c}", "is it still {w} in {c}", "is it {w} over in {c}",
                  "would it be {w} in {c}", "any chance it's {w} in {c}", "is {c} {w}"]
YESNO_WORD_EN = ["raining", "snowing", "sunny", "cold", "hot", "warm", "windy", "foggy", "cloudy", "freezing",
                 "nice", "chilly", "humid", "stormy", "dry", "wet", "clear"]
VERB_WEATHER_EN = ["will it rain in {c}", "will it snow in {c}", "does it rain in {c}",
                   "should I take an umbrella to {c}", "should I bring a jacket in {c}", "do I need sunglasses in {c}",
                   "can I go out without a coat in {c}", "is the weather good in {c}", "is the weather bad in {c}",
                   "is it a nice day in {c}"]
OUTSIDE_EN = ["what's it like outside in {c}", "what is it like outside in {c}", "how is it outside in {c}",
              "how's it outside in {c}", "what's it like out in {c}", "how does it look outside in {c}",
              "what's it doing outside in {c}", "how are things outside in {c}", "what's the sky like in {c}",
              "what's it like there in {c}", "how's the day looking in {c}", "what should I wear in {c}"]
YESNO_ZH = ["{c}{t}{w}吗", "{c}{t}{w}了吗", "{c}{t}会{w}吗", "{c}{t}会不会{w}", "{c}{t}有没有{w}", "{c}{t}是不是在{w}",
            "{c}{t}{w}不{w}"]
YESNO_WORD_ZH = ["下雨", "下雪", "冷", "热", "晴", "刮风", "有雾", "暖和", "凉快", "出太阳"]
OUTSIDE_ZH = ["{c}{t}外面怎么样", "{c}{t}外面冷吗", "{c}{t}外面热不热", "{c}{t}外边天气好吗", "{c}{t}外头什么情况",
              "{c}{t}出门要带伞吗", "{c}{t}出门穿什么", "{c}{t}天气好不好", "{c}{t}适合出门吗", "{c}{t}天怎么样",
              "{c}{t}是什么天", "{c}{t}阴天还是晴天"]
TIME_ZH = ["", "", "现在", "今天", "今天的", "这会儿", "明天", "目前", "那边", "外面"]


def yes_no_weather_question(rng: random.Random, city: str, lang: str) -> str:
    """A weather question asked as yes/no or as "what's it like outside": a frame crossed with a condition and a time
    (Chinese: the time, 现在/今天/..., written straight after the city, no space, as people do)."""
    if lang == "en":
        r = rng.random()
        if r < 0.5:
            core = rng.choice(YESNO_FRAME_EN).format(w=rng.choice(YESNO_WORD_EN), c=city)
        elif r < 0.7:
            core = rng.choice(VERB_WEATHER_EN).format(c=city)
        else:
            core = rng.choice(OUTSIDE_EN).format(c=city)
        return _finish_en(rng, core + rng.choice(WHEN_EN), LEAD_WEATHER_EN, TAIL_EN[:8])
    t = rng.choice(TIME_ZH)
    frame = rng.choice(YESNO_ZH) if rng.random() < 0.55 else rng.choice(OUTSIDE_ZH)
    word = rng.choice(YESNO_WORD_ZH[:6] if "不{w}" in frame else YESNO_WORD_ZH)   # 下雨不下雨, not 有雾不有雾
    core = frame.replace("{w}", word).format(c=city, t=t)
    if city[:1].isascii() and rng.random() < 0.3:
        core = core.replace(city, city + " ", 1)
    return _finish_zh(rng, rng.choice(["", "", "", "请问", "你好，", "问一下，"]) + core)


def chinese_numeral(rng: random.Random) -> int:
    """An operand for a question written in Chinese numerals: units, 十-teens, tens round and compound, hundreds round,
    with 零 or with tens, thousands round and compound."""
    r = rng.random()
    if r < 0.15:
        return rng.randint(1, 9)
    if r < 0.3:
        return rng.randint(10, 19)
    if r < 0.45:
        return rng.randint(2, 9) * 10
    if r < 0.6:
        return rng.randint(21, 99)
    if r < 0.75:
        return rng.randint(1, 9) * 100
    if r < 0.88:
        return rng.randint(1, 9) * 100 + rng.choice((rng.randint(1, 9), rng.randint(1, 9) * 10, rng.randint(11, 99)))
    return rng.randint(1, 9) * 1000 + rng.choice((0, 0, rng.randint(1, 9) * 100, rng.randint(1, 999)))


def chinese_numeral_question(rng: random.Random, a: int, op: str, b: int) -> str:
    """A Chinese question whose numbers are Chinese numerals (both, mostly; now and then one in digits): 五十减十七,
    三百加两百, 二十五乘以四, 一百零五除以五, the operation a Chinese word, written close or spaced."""
    r = rng.random()
    words = (True, True) if r < 0.85 else rng.choice([(True, False), (False, True)])
    x_a = chinese(a, rng) if words[0] else str(a)
    x_b = chinese(b, rng) if words[1] else str(b)
    if rng.random() < 0.12:
        x = rng.choice(VERB_ZH[op]).format(a=x_a, b=x_b)
    else:
        word = rng.choice(OP_WORDS_ZH[op][:2] * 3 + OP_WORDS_ZH[op][2:])
        x = f"{x_a} {word} {x_b}" if rng.random() < 0.25 else f"{x_a}{word}{x_b}"
    return _finish_zh(rng, rng.choice(ASK_ZH).format(x=x))


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
    if extended and rng.random() < 0.3:
        return yes_no_weather_question(rng, city, lang)
    if lang == "en":
        if rng.random() < 0.25:
            core = rng.choice(POLITE_EN) + rng.choice(DO_WEATHER_EN)
        else:
            core = rng.choice(ASK_WEATHER_EN)
        return _finish_en(rng, core.format(c=city) + rng.choice(WHEN_EN), LEAD_WEATHER_EN, TAIL_EN[:8])
    when = rng.choice(WHEN_ZH + WHEN_ZH[3:] if extended else WHEN_ZH)   # extended: a time after the name more often
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
