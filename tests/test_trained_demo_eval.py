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
