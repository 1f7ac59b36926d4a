"""Simon Willison's `llm` against a live server, configured the way its docs say for an OpenAI-compatible
server: `extra-openai-models.yaml` (a chat model, a completion model and a Responses model) and a key
stored under `api_key_name`. Its Python API (prompt whole and streamed, usage, schema output through
response_format json_schema, a conversation) and its CLI (`llm -m ... -u`, `llm logs`, an error's exit)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import openai
import pytest
from http_server import ServerThread
from pydantic import BaseModel, Field

import llm  # noqa: E402  (the test extra: a missing package is an error, not a skip)

MODEL = "demo-model-1"
LLM_BIN = os.path.join(os.path.dirname(sys.executable), "llm")
PROMPT = "Say something about Paris."


class Weather(BaseModel):
    city: str = Field(max_length=12)
    days: int = Field(ge=1, le=7)


@pytest.fixture(scope="module")
def server(demo_model_dir):
    with ServerThread(dtype="float32", max_model_len=1024, num_kv_blocks=256) as s:
        yield s


@pytest.fixture(scope="module")
def user_dir(server, tmp_path_factory):
    """LLM_USER_PATH with the three models and their key, as `llm keys set modelcall` would store it."""
    d = tmp_path_factory.mktemp("llm_user")
    base = server.base_url + "/v1"
    models = [{"model_id": "mc", "model_name": MODEL, "api_base": base, "api_key_name": "modelcall",
               "supports_schema": True},
              {"model_id": "mc-completion", "model_name": MODEL, "api_base": base, "api_key_name": "modelcall",
               "completion": True},
              {"model_id": "mc-responses", "model_name": MODEL, "api_base": base, "api_key_name": "modelcall",
               "responses": True, "supports_schema": True}]
    (d / "extra-openai-models.yaml").write_text(json.dumps(models))  # JSON is YAML
    (d / "keys.json").write_text(json.dumps({"modelcall": "unused"}))
    before = os.environ.get("LLM_USER_PATH")
    os.environ["LLM_USER_PATH"] = str(d)
    yield d
    if before is None:
        os.environ.pop("LLM_USER_PATH", None)
    else:
        os.environ["LLM_USER_PATH"] = before


@pytest.fixture(scope="module")
def reference(server):
    """The same greedy requests through the openai SDK: what llm must hand back."""
    oai = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    chat = oai.chat.completions.create(model=MODEL, max_tokens=8, temperature=0.0,
                                       messages=[{"role": "user", "content": PROMPT}])
    text = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0.0)
    return {"chat": chat, "completion": text.choices[0].text}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_prompt_returns_the_servers_text_and_usage(user_dir, reference, stream):
    r = llm.get_model("mc").prompt(PROMPT, stream=stream, max_tokens=8, temperature=0.0)
    chunks = list(r)
    ref = reference["chat"]
    assert r.text() == "".join(chunks) == ref.choices[0].message.content
    if stream:
        assert len(chunks) > 1
    u = r.usage()  # streamed: read from the include_usage chunk llm asks for
    assert (u.input, u.output) == (ref.usage.prompt_tokens, 8)
    rj = r.response_json  # what llm logs: its own merge of the chunks, or the whole body
    assert (rj["finish_reason"] if stream else rj["choices"][0]["finish_reason"]) == "length"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_completion_and_responses_models(user_dir, reference, stream):
    r = llm.get_model("mc-completion").prompt(PROMPT, stream=stream, max_tokens=8, temperature=0.0)
    assert r.text() == reference["completion"] and r.text()
    r = llm.get_model("mc-responses").prompt(PROMPT, stream=stream, max_tokens=8, temperature=0.0)
    assert r.text() == reference["chat"].choices[0].message.content  # the same prompt through /v1/responses
    if not stream:  # llm reads usage from response.completed; a max_output_tokens cut ends response.incomplete
        assert (r.usage().input, r.usage().output) == (reference["chat"].usage.prompt_tokens, 8)


@pytest.mark.parametrize("model", ["mc", "mc-responses"])
def test_schema_output_validates(user_dir, model):
    # NOTE: additionalProperties false as a dict schema: pydantic's own schema allows extra keys, which a
    # random-weight model fills until max_tokens (llm's Responses class cannot send a seed to pin that down)
    schema = {**Weather.model_json_schema(), "additionalProperties": False}
    r = llm.get_model(model).prompt("Weather in Oslo as JSON.", schema=schema, max_tokens=96, temperature=1.0)
    Weather.model_validate_json(r.text())  # constrained decoding held the bounds llm sent as json_schema
    assert json.loads(r.text()).keys() == {"city", "days"}


def test_conversation_sends_the_history(user_dir):
    conv = llm.get_model("mc").conversation()
    first = conv.prompt("Hello there.", max_tokens=4, temperature=0.0)
    first.text()
    second = conv.prompt("And again.", max_tokens=4, temperature=0.0)
    second.text()
    assert second.usage().input > first.usage().input + 4  # the first turn and its answer came along


def test_context_overflow_raises_the_sdks_400(user_dir):
    with pytest.raises(openai.BadRequestError) as e:
        llm.get_model("mc").prompt(PROMPT, max_tokens=100_000).text()
    assert e.value.code == "context_length_exceeded"


def test_cli_prompt_usage_logs_and_error(user_dir, reference):
    env = {**os.environ, "LLM_USER_PATH": str(user_dir)}
    run = subprocess.run([LLM_BIN, "-m", "mc", "-o", "max_tokens", "8", "-o", "temperature", "0", "-u", PROMPT],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.rstrip("\n") == reference["chat"].choices[0].message.content.rstrip("\n")
    assert f"Token usage: {reference['chat'].usage.prompt_tokens} input, 8 output" in run.stderr
    logs = subprocess.run([LLM_BIN, "logs", "--json", "-n", "1"], env=env, capture_output=True, text=True, timeout=120)
    (row,) = json.loads(logs.stdout)
    assert row["model"] == "mc" and row["output_tokens"] == 8
    bad = subprocess.run([LLM_BIN, "-m", "mc", "-o", "max_tokens", "100000", PROMPT], env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "Error code: 400" in bad.stderr and "maximum context length" in bad.stderr
