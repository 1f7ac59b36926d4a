"""The trained demo model (issues 19 and 45): `modelcall serve` with no model flag serves it, and through
`modelcall agent` it answers held-out arithmetic with the calculator, asks get_weather for the city
asked, in English and Chinese, and answers a slice of the hand-written split (questions phrased as
people phrase them, cities it never saw); the committed weights' measured accuracy is reproduced; the
tools are exact and deterministic."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from modelcall.plugins.demo_model import corpus, trained_model_dir
from modelcall.plugins.demo_model.train import SEED, TRAIN
from modelcall.plugins.demo_model.tools import calculator, evaluate, format_number, get_weather, weather_of

TOOLS = ["modelcall.plugins.demo_model.tools:calculator", "modelcall.plugins.demo_model.tools:get_weather"]
BIN = os.path.join(os.path.dirname(sys.executable), "modelcall")
# Of the hand-written split's 20-question slice, what the committed model (trainer 3) answers right through the agent
# (4: it was trained on one phrasing per question and 48 city names; docs/demo-model.md, issue 45). A floor that
# a replacement model must raise, never lower.
SLICE_RIGHT = 4


# ---- the tools ------------------------------------------------------------------------------------

def test_calculator_is_exact_and_evaluates_only_arithmetic():
    assert calculator("37 * 91") == "3367"
    assert calculator("(2 + 3) * 4 - 2 ** 10") == "-1004"
    assert calculator("7 / 2") == "3.5" and calculator("1 / 3") == "0.333333" and calculator("10 / 5") == "2"
    assert calculator("6 × 7") == "42"
    for bad in ["__import__('os')", "x + 1", "1 / 0", "2 ** 1000", "open('f')", "1 +", "9" * 300]:
        with pytest.raises(ValueError):
            calculator(bad)


def test_get_weather_is_deterministic_and_typed():
    assert get_weather("Paris") == get_weather("  Paris ") == weather_of("Paris")
    assert get_weather.parameters["required"] == ["city"] and calculator.parameters["required"] == ["expression"]
    reports = [weather_of(en) for en, _ in corpus.CITIES]
    assert {r["condition"] for r in reports} == {"sunny", "cloudy", "rainy", "windy", "snowy", "foggy"}
    assert all(-9 <= r["temperature_c"] <= 34 for r in reports)


# ---- the demo model by name -------------------------------------------------------------------------

def _serve_trained(env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # NOTE: 256 KV blocks (4,096 tokens), not the default 1 GB: zeroing that on huge pages costs ~2 s of the start.
    proc = subprocess.Popen([BIN, "serve", "--model", "trained", "--port", str(port), "--num-kv-blocks", "256"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"modelcall serve did not start: {proc.stderr.read() if proc.stderr else ''}")
        time.sleep(0.3)


@pytest.fixture(scope="module")
def served():
    """`modelcall serve --model trained` (the README's walk-through) with nothing in the environment choosing a demo
    model (tests/conftest.py sets MODELCALL_DEMO_MODEL=random for the rest of the suite: dropped here)."""
    env = {k: v for k, v in os.environ.items() if k != "MODELCALL_DEMO_MODEL"}
    proc, url = _serve_trained(env)
    yield url
    proc.terminate()
    proc.wait(30)


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def _agent_turns(chat: dict) -> list[list[dict]]:
    """The messages `modelcall agent` sends for a corpus chat's two turns: the question, then the
    question, the model's call (arguments as the model's JSON text, no reasoning) and the result."""
    question, assistant, tool = chat["messages"][:3]
    fn = assistant["tool_calls"][0]["function"]
    call = {"id": "call_0_0", "type": "function",
            "function": {"name": fn["name"], "arguments": json.dumps(fn["arguments"], ensure_ascii=False)}}
    first = [{"role": "user", "content": question["content"]}]
    return [first, first + [{"role": "assistant", "content": "", "tool_calls": [call]},
                            {"role": "tool", "tool_call_id": "call_0_0", "content": tool["content"]}]]


def _training_prompts(tok, chat: dict) -> list[list[int]]:
    """The ids train.py conditions each learnt reply on: its system block, then its row up to the
    start of each learnt run (the first turn's call, the last turn's answer), in turn order."""
    from modelcall.plugins.demo_model import rows
    prompts = {}
    for system, pieces in rows.examples(tok, chat):
        ((_, [(ids, mask)]),) = rows.tokenize_rows(tok, [(system, pieces)]).items()
        head = tok(system, add_special_tokens=False).input_ids
        for j in range(1, len(ids)):
            if mask[j] and not mask[j - 1]:
                prompts[len(head) + j] = head + ids[:j]
    return [prompts[k] for k in sorted(prompts)]


def test_training_prompts_are_what_the_server_renders_for_the_agent(served):
    """Token for token, the prompts the model was trained on are the ones `modelcall serve` renders
    for `modelcall agent`'s requests (tools as the agent's typed Tools send them, normalized by the
    server; the call fed back as the agent feeds it), in English and Chinese, both tools."""
    import random
    from transformers import AutoTokenizer
    from modelcall.plugins.demo_model.tools import TOOLS as DEMO_TOOLS

    tok = AutoTokenizer.from_pretrained(trained_model_dir())
    rng = random.Random(3)
    chats = [corpus.arithmetic_chat(rng, "37 * 91", "en"), corpus.arithmetic_chat(rng, "280 - 914", "zh"),
             corpus.weather_chat(rng, ("New York", "纽约"), "en"), corpus.weather_chat(rng, ("San Francisco", "旧金山"), "zh")]
    agent_tools = [t.openai() for t in DEMO_TOOLS]
    for chat in chats:
        trained = _training_prompts(tok, chat)
        served_ids = [_post(served + "/tokenize", {"messages": m, "tools": agent_tools})["tokens"]
                      for m in _agent_turns(chat)]
        assert trained == served_ids, chat["messages"][0]["content"]


def test_the_agent_sends_the_trained_prompts(served, capsys):
    """The same through a real `modelcall agent` run: each request's prompt token count is the
    training prompt's length for that turn (a tool spec or a fed-back call rendered differently would
    change it)."""
    from transformers import AutoTokenizer
    import random

    tok = AutoTokenizer.from_pretrained(trained_model_dir())
    chat = corpus.weather_chat(random.Random(0), ("Paris", "巴黎"), "en")
    chat["messages"][0]["content"] = "What's the weather in Paris?"
    result = _agent(served, "What's the weather in Paris?", capsys)
    assert [len(p) for p in _training_prompts(tok, chat)] == [r["usage"]["prompt_tokens"] for r in result["requests"]]


def test_serve_with_model_trained_serves_the_trained_model(served):
    with urllib.request.urlopen(served + "/v1/models", timeout=10) as r:
        models = json.load(r)["data"]
    from transformers import AutoTokenizer
    trained = AutoTokenizer.from_pretrained(trained_model_dir())
    text = "What is 37 * 91? 巴黎"
    tokens = _post(served + "/tokenize", {"prompt": text})["tokens"]
    # the trained tokenizer's ids, with a city as one token (the random model's splits it in bytes)
    assert models and tokens == trained(text, add_special_tokens=False).input_ids
    assert len(_post(served + "/tokenize", {"prompt": "巴黎"})["tokens"]) == 1


def _agent(url: str, question: str, capsys) -> dict:
    from modelcall.plugins.cli.main import main
    code = main(["agent", "--base-url", url, "--tools", *TOOLS, "--json", "--max-turns", "3",
                 "--param", "temperature=0", "--param", "max_tokens=80", question])
    out = capsys.readouterr().out
    result = json.loads(out)
    assert code in (0, 1), out
    return result


def test_held_out_arithmetic_is_answered_through_the_calculator(served, capsys):
    """20 arithmetic questions none of which is in the training corpus (held out by expression):
    at least 18 answered with the calculator's correct result, through `modelcall agent`."""
    training = {m["tool_calls"][0]["function"]["arguments"].get("expression")
                for c in corpus.chats(TRAIN["chats"], seed=SEED) for m in c["messages"] if m.get("tool_calls")}
    expressions = corpus.held_out()[:20]
    assert not set(expressions) & training
    right, seen = 0, []
    for i, e in enumerate(expressions):
        question = (corpus.ARITH_EN[i % len(corpus.ARITH_EN)] if i % 2 == 0
                    else corpus.ARITH_ZH[i % len(corpus.ARITH_ZH)]).format(e=e)
        result = _agent(served, question, capsys)
        want = format_number(evaluate(e))
        calls = [c for c in result["tool_calls"] if c["name"] == "calculator" and c["status"] == "ok"]
        ok = (result["status"] == "answered" and len(calls) == 1 and calls[0]["result"] == want
              and want in (result["answer"] or ""))
        right += ok
        seen.append((question, [c["arguments"] for c in calls], result["answer"], ok))
    assert right >= 18, seen


def test_a_slice_of_the_hand_written_split_is_answered_through_the_agent(served, capsys):
    """20 questions of the hand-written split (every sixth: arithmetic in words, digits and Chinese, weather
    for cities outside the training list, mixed-language turns, questions needing no tool) through
    `modelcall agent`, judged as the whole split is judged in docs/demo-model.md."""
    from modelcall.plugins.demo_model import evalset
    rows = evalset.load()[::6]
    assert len(rows) == 20
    verdicts, seen = [], []
    for row in rows:
        result = _agent(served, row["question"], capsys)
        calls = [evalset.Call(c["name"], c["arguments"], c["status"], c["result"]) for c in result["tool_calls"]]
        verdict = evalset.judge(row, calls, result["answer"], result["status"])
        verdicts.append(verdict)
        seen.append((row["question"], [c.arguments for c in calls], result["answer"], verdict.right))
    assert sum(v.right for v in verdicts) >= SLICE_RIGHT, seen


@pytest.mark.parametrize("question,city", [
    ("What's the weather in Paris?", "Paris"), ("How is the weather in Tokyo?", "Tokyo"),
    ("Tell me the weather in New York.", "New York"), ("东京的天气怎么样？", "东京"),
    ("北京今天天气如何？", "北京"), ("查一下旧金山的天气。", "旧金山")])
def test_weather_questions_call_get_weather_with_the_city_asked(served, capsys, question, city):
    result = _agent(served, question, capsys)
    (call,) = result["tool_calls"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": city}
    report = weather_of(city)
    assert result["status"] == "answered" and f"{report['temperature_c']}°C" in result["answer"]


def test_the_agent_command_runs_in_its_own_process(served):
    """The whole loop through the real CLI: the model's call parsed by the server, run by the agent with
    the city asked, the report fed back, the answer built on it (a question it answers today)."""
    out = subprocess.run([BIN, "agent", "--base-url", served, "--tools", *TOOLS, "--json",
                          "--param", "temperature=0", "What's the weather in Paris?"],
                         capture_output=True, text=True, timeout=180)
    result = json.loads(out.stdout)
    assert out.returncode == 0 and result["status"] == "answered", out.stderr
    (call,) = result["tool_calls"]
    assert call["name"] == "get_weather" and call["status"] == "ok" and json.loads(call["arguments"]) == {"city": "Paris"}
    assert [r["finish_reason"] for r in result["requests"]] == ["tool_calls", "stop"]
    assert f"{weather_of('Paris')['temperature_c']}°C" in result["answer"]


def test_the_demo_models_are_one_name_away_and_the_environment_can_make_one_the_default(monkeypatch):
    from modelcall.core.config import KernelConfig
    from modelcall.plugins.demo_model import demo_model_dir, plugin
    monkeypatch.delenv(plugin.DEMO_MODEL_ENV, raising=False)
    assert plugin.provide_model_dir(KernelConfig()) is None   # the default model is the registry's SmolLM2
    assert plugin.provide_model_dir(KernelConfig(model="trained")) == trained_model_dir()
    assert plugin.provide_model_dir(KernelConfig(model="random")) == demo_model_dir()
    monkeypatch.setenv(plugin.DEMO_MODEL_ENV, "trained")
    assert plugin.provide_model_dir(KernelConfig()) == trained_model_dir()
    monkeypatch.setenv(plugin.DEMO_MODEL_ENV, "random")
    assert plugin.provide_model_dir(KernelConfig()) == demo_model_dir()
    monkeypatch.setenv(plugin.DEMO_MODEL_ENV, "big")
    with pytest.raises(Exception, match="MODELCALL_DEMO_MODEL"):
        plugin.wanted_kind()


# ---- the committed weights ------------------------------------------------------------------------

def test_committed_weights_reproduce_their_measured_accuracy():
    """The accuracy in modelcall_demo.json is what `train.py --check` measures on the committed files."""
    from modelcall.plugins.demo_model.measure import measure
    path = trained_model_dir()
    with open(os.path.join(path, "modelcall_demo.json"), encoding="utf-8") as f:
        meta = json.load(f)
    assert meta["parameters"] <= 10_000_000
    assert sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path)) <= 10 * 2**20
    assert measure(path) == meta["accuracy"]
