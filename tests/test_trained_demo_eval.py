"""The trained demo model's hand-written evaluation split (issue 45) stays apart from its training set, its
answer key is right, and the judge and the training set's number words do what they say."""
from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter

from modelcall.plugins.demo_model import corpus, evalset, focus, places
from modelcall.plugins.demo_model.lora_train import TRAIN as AGENT_TRAIN
from modelcall.plugins.demo_model.numbers import chinese, english
from modelcall.plugins.demo_model.tools import calculator, weather_of
from modelcall.plugins.demo_model.train import SEED, TRAIN


def test_the_split_is_large_enough_and_its_answer_key_is_the_tools_own():
    rows = evalset.load()
    assert len(rows) >= 100
    assert len({r["question"] for r in rows}) == len(rows)
    kinds = Counter(r["kind"] for r in rows)
    assert {"arith-en-numwords", "arith-zh", "weather-en-new", "weather-zh-new", "mixed", "none-en", "none-zh"} <= set(kinds)
    for r in rows:
        if r["tool"] == "calculator":
            assert calculator(r["expression"]) == r["result"], r
        else:
            assert r["tool"] in ("get_weather", None) and ("city" in r) == (r["tool"] == "get_weather"), r


def _assert_apart(chats: list[dict]) -> None:
    """No chat asks an evaluation question, calls the calculator with an evaluation expression or names an
    evaluation city."""
    rows = evalset.load()
    questions, asked, cities = set(), set(), set()
    for chat in chats:
        questions.add(" ".join(chat["messages"][0]["content"].split()).casefold())
        for m in chat["messages"]:
            for c in m.get("tool_calls") or []:
                args = c["function"]["arguments"]
                asked.add(args.get("expression"))
                cities.add(str(args.get("city", "")).casefold())
    assert len(questions) > len(chats) // 2   # the phrasings vary
    assert not [r["question"] for r in rows if " ".join(r["question"].split()).casefold() in questions]
    assert not {r["expression"] for r in rows if r["tool"] == "calculator"} & asked
    eval_cities = {r["city"].casefold() for r in rows if r["tool"] == "get_weather"}
    assert not eval_cities & cities
    assert not eval_cities & {n.casefold() for pair in places.REAL_CITIES for n in pair}


def test_no_question_expression_or_city_of_the_split_is_in_the_training_set():
    """The committed training set (TRAIN["chats"] chats of seed SEED) is apart from the split."""
    _assert_apart(list(corpus.chats(TRAIN["chats"], seed=SEED)))


def test_the_agent_adapters_weak_spot_stage_is_apart_from_the_split_and_weighted_to_its_weak_spots():
    """The agent demo's weak-spot stage (focus.py) draws past the first set, apart from the split, and more of its
    chats are of the kinds the second stage missed than the corpus's."""
    start = AGENT_TRAIN["chats"]
    chats = list(focus.focus_chats(focus.STAGE_CHATS, start, seed=SEED))
    assert len(chats) == focus.STAGE_CHATS
    _assert_apart(chats)
    first = {c["messages"][0]["content"] for c in corpus.chats(start, seed=SEED)}
    # new tool chats, mostly (chats without a tool repeat a fixed list of small talk and facts)
    assert sum(c["messages"][0]["content"] in first for c in chats if focus.tool_call(c)) < len(chats) // 10
    weighted = sum(focus.weak_spot(c) for c in chats) / len(chats)
    plain = sum(focus.weak_spot(c) for c in corpus.chats(1000, seed=SEED)) / 1000
    assert weighted > plain + 0.1, (weighted, plain)


def _round_in_words(chat: dict) -> bool:
    """A calculator chat whose question writes a round operand (50, 300, 2000) in words."""
    call = focus.tool_call(chat)
    if call is None or call[0] != "calculator":
        return False
    question = chat["messages"][0]["content"]
    return any(int(n) % 10 == 0 and n not in question for n in re.findall(r"\d+", call[1]["expression"]))


def _compound_city(chat: dict) -> bool:
    call = focus.tool_call(chat)
    return call is not None and call[0] == "get_weather" and any(ch in call[1]["city"] for ch in " -")


def test_the_extended_rules_hold_what_the_adapter_missed_and_stay_apart_from_the_split():
    """corpus.chats(extended=True), the agent adapter's third stage: apart from the split, and many more of its chats
    write round operands in words, bracket an expression or name a multi-word or hyphenated city than the stream the
    earlier stages learnt, which it leaves as it was."""
    n = 4000
    extended = list(corpus.chats(n, seed=SEED, extended=True))
    _assert_apart(extended)
    plain = list(corpus.chats(n, seed=SEED))
    digest = hashlib.sha256(json.dumps(plain[:500], ensure_ascii=False, sort_keys=True).encode()).hexdigest()
    assert digest.startswith("e34cc92e571fb9f9"), digest   # the first stages' chats, unchanged
    digest = hashlib.sha256(json.dumps(extended[:500], ensure_ascii=False, sort_keys=True).encode()).hexdigest()
    assert digest.startswith("eb59f85f951e7847"), digest   # the committed adapter's chats (both stages)
    for weak in (_round_in_words, _compound_city):
        assert sum(map(weak, extended)) > 2 * sum(map(weak, plain)), weak.__name__
    brackets = [sum("(" in str((focus.tool_call(c) or ("", {}))[1].get("expression")) for c in cs)
                for cs in (extended, plain)]
    assert brackets[0] > 2 * brackets[1], brackets
    questions = " ".join(c["messages"][0]["content"] for c in extended)
    assert re.search(r"\b(twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety) (one|two|three|four|five|six|seven|"
                     r"eight|nine)\b", questions)   # compounds of tens spaced as well as hyphenated
    assert "-" in places.made_up_city(random.Random(3), "en", extended=True) or any(
        " " in places.made_up_city(random.Random(s), "en", extended=True) for s in range(20))


_ZH_NUMERAL = re.compile("[零一二两三四五六七八九十百千]")


def _chinese_numerals(chat: dict) -> bool:
    """A calculator chat asked in Chinese numerals, with a ten, hundred or thousand in them (十, 百, 千)."""
    call = focus.tool_call(chat)
    question = chat["messages"][0]["content"]
    return call is not None and call[0] == "calculator" and bool(re.search("[十百千]", question)) and \
        not re.search("[A-Za-z]", question)


def _yes_no_weather(chat: dict) -> bool:
    call = focus.tool_call(chat)
    question = chat["messages"][0]["content"].casefold()
    return call is not None and call[0] == "get_weather" and bool(
        re.search(r"\b(is it|will it|should i|outside|out in|is the weather)\b", question) or
        re.search("外面|外边|外头|会|出门|是不是|有没有|不下|了吗", question))


def _han_name_then_text(chat: dict) -> bool:
    """A weather chat whose Chinese question writes ordinary text (现在, 今天, 的天气...) straight after a Han name
    of 3-5 characters."""
    call = focus.tool_call(chat)
    if call is None or call[0] != "get_weather":
        return False
    city, question = call[1]["city"], chat["messages"][0]["content"]
    at = question.find(city)
    return 3 <= len(city) <= 5 and not city[:1].isascii() and at >= 0 and question[at + len(city):][:1] in \
        set("现今的外明目那这此天气多冷热下会是有刮")


def _han_weather(chat: dict) -> bool:
    call = focus.tool_call(chat)
    return call is not None and call[0] == "get_weather" and not call[1]["city"][:1].isascii()


def test_the_extended_rules_give_chinese_numerals_yes_no_weather_and_han_boundaries_their_share():
    """The second version of the extended rules (issue 45's from-scratch run read 十二加九 as 1229000000 and cut
    加德满都 short): Chinese questions in Chinese numerals with 十/百/千 composing (two forms of 2), weather asked
    yes/no or as "what's it like outside" in both languages, and Han names of 3-5 characters with text straight
    after them, each several times as common as in the plain stream, within the extended stream's first 2,400 chats
    (the rows the two stages see)."""
    n = 2400
    extended = list(corpus.chats(n, seed=SEED, extended=True))
    plain = list(corpus.chats(n, seed=SEED))
    counts = {weak.__name__: (sum(map(weak, extended)), sum(map(weak, plain)))
              for weak in (_chinese_numerals, _yes_no_weather, _han_name_then_text, _han_weather)}
    numerals, yes_no, han_text, han = counts["_chinese_numerals"], counts["_yes_no_weather"], \
        counts["_han_name_then_text"], counts["_han_weather"]
    assert numerals[0] > 300 and numerals[0] > 1.8 * numerals[1], counts   # the old extended rules: 147 (plain 175)
    assert yes_no[0] > 1.3 * yes_no[1], counts
    assert han_text[0] / han[0] > han_text[1] / han[1] + 0.08, counts   # of the weather chats naming a Han city
    questions = " ".join(c["messages"][0]["content"] for c in extended)
    for form in ("两百", "二百", "两千", "零", "十五", "五十"):
        assert form in questions, form
    assert re.search(r"(?i)what's it like outside in ", questions) and "外面" in questions
    han = [places.made_up_city(random.Random(s), "zh", extended=True) for s in range(300)]
    assert {len(h) for h in han} == {2, 3, 4, 5}
    assert sum(h[-1] in places.HAN_FINALS for h in han) > 0.3 * len(han)


def test_chinese_numerals_compose_tens_hundreds_and_thousands():
    """Every operand the extended rules draw for a Chinese-numeral question is written as people write it: 十二 (no
    一十), 二十五, 一百零五, 一百一十, 两百 or 二百, 两千零二; and reads back to its value."""
    rng = random.Random(0)
    assert chinese(12) == "十二" and chinese(17) == "十七" and chinese(10) == "十" and chinese(110) == "一百一十"
    assert chinese(1010) == "一千零一十" and chinese(2002) == "二千零二" and chinese(9999) == "九千九百九十九"
    assert {chinese(200, random.Random(s)) for s in range(20)} == {"两百", "二百"}
    assert {chinese(20, random.Random(s)) for s in range(20)} == {"二十"}   # never 两十

    def read(text: str) -> int:
        digits = {c: i for i, c in enumerate("零一二三四五六七八九")} | {"两": 2}
        total, unit_value = 0, 0
        for c in text:
            if c in digits:
                unit_value = digits[c]
            else:
                total += (unit_value or 1) * {"十": 10, "百": 100, "千": 1000}[c]
                unit_value = 0
        return total + unit_value
    from modelcall.plugins.demo_model.phrasing import chinese_numeral
    for _ in range(3000):
        n = chinese_numeral(rng)
        text = chinese(n, rng)
        assert read(text) == n and not text.startswith("一十"), (n, text)


def _calc(arguments: str, result: str, status: str = "ok") -> evalset.Call:
    return evalset.Call("calculator", arguments, status, result)


def test_the_judge_wants_the_tool_the_arguments_and_the_result_copied():
    sum_row = {"kind": "k", "question": "q", "tool": "calculator", "expression": "12 * 7", "result": "84"}
    ok = evalset.judge(sum_row, [_calc('{"expression": "7 * 12"}', "84")], "12 * 7 = 84.", "answered")
    assert ok.right and ok.called == "calculator" and ok.copied
    assert not evalset.judge(sum_row, [_calc('{"expression": "12 * 7"}', "84")], "12 * 7 = 8.", "answered").right
    assert not evalset.judge(sum_row, [_calc('{"expression": "12 + 7"}', "19")], "12 + 7 = 19.", "answered").right
    assert not evalset.judge(sum_row, [], "84", "answered").right
    city_row = {"kind": "k", "question": "q", "tool": "get_weather", "city": "Reykjavik"}
    report = weather_of("Reykjavik")
    call = evalset.Call("get_weather", '{"city": "reykjavik"}', "ok", json.dumps(report))
    assert evalset.judge(city_row, [call], f"It is {report['temperature_c']}°C.", "answered").right
    wrong_city = evalset.Call("get_weather", '{"city": "Reykjavi"}', "ok", json.dumps(weather_of("Reykjavi")))
    assert not evalset.judge(city_row, [wrong_city], f"It is {weather_of('Reykjavi')['temperature_c']}°C.",
                             "answered").right
    none_row = {"kind": "k", "question": "q", "tool": None}
    assert evalset.judge(none_row, [], "Hello!", "answered").right
    assert not evalset.judge(none_row, [_calc('{"expression": "1 + 1"}', "2")], "2", "answered").right
    assert not evalset.judge(none_row, [], "", "answered").right


def test_numbers_in_words_read_as_people_write_them():
    assert [english(n) for n in (7, 12, 25, 40, 100, 342, 2040)] == [
        "seven", "twelve", "twenty-five", "forty", "one hundred", "three hundred forty-two", "two thousand forty"]
    assert [chinese(n) for n in (7, 12, 25, 100, 105, 300, 2040)] == [
        "七", "十二", "二十五", "一百", "一百零五", "三百", "二千零四十"]
    assert [english(n, random.Random(0), spaced=1.0) for n in (23, 40, 99)] == ["twenty three", "forty", "ninety nine"]
