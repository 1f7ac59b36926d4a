"""POST /tokenize, POST /detokenize, GET /tokenizer_info in vLLM's shapes, read by a real client
(lm-eval's remote tokenizer) and checked against the model's own tokenizer."""
from __future__ import annotations

import pytest
import requests

from http_server import ServerThread

TEXT = "def f(x):\n    return x * 2  # é ✓\n"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def server(demo_model_dir):
    with ServerThread(dtype="float32", max_model_len=512) as s:
        yield s


@pytest.fixture(scope="module")
def hf(demo_model_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(demo_model_dir)


def _post(server, path, body):
    return requests.post(server.base_url + path, json=body, timeout=30)


def test_tokenize_a_prompt(server, hf):
    r = _post(server, "/tokenize", {"prompt": TEXT, "add_special_tokens": False, "return_token_strs": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens"] == hf.encode(TEXT, add_special_tokens=False)
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 512
    assert len(body["token_strs"]) == body["count"]
    assert _post(server, "/tokenize", {"prompt": TEXT}).json()["token_strs"] is None


def test_tokenize_chat_messages_with_the_template(server, hf):
    r = _post(server, "/tokenize", {"messages": MESSAGES})
    assert r.status_code == 200, r.text
    want = hf.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert r.json()["tokens"] == want
    # the same count the chat route charges for that prompt
    chat = _post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1}).json()
    assert chat["usage"]["prompt_tokens"] == r.json()["count"]
    bare = _post(server, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False}).json()
    assert bare["count"] < r.json()["count"]


def test_detokenize_round_trips(server, hf):
    ids = hf.encode(TEXT, add_special_tokens=False)
    r = _post(server, "/detokenize", {"tokens": ids})
    assert r.status_code == 200 and r.json() == {"prompt": TEXT}
    eos = hf.convert_tokens_to_ids("<|im_end|>")
    assert _post(server, "/detokenize", {"tokens": [eos]}).json()["prompt"] == "<|im_end|>"  # specials kept


def test_tokenizer_info_names_the_special_tokens(server, hf):
    r = requests.get(server.base_url + "/tokenizer_info", timeout=30)
    assert r.status_code == 200
    info = r.json()
    assert info["eos_token"] == hf.eos_token == "<|im_end|>"
    assert info["pad_token"] == hf.pad_token and info["chat_template"] == hf.chat_template
    assert info["max_model_len"] == 512


def test_lm_evals_remote_tokenizer_reads_these_routes(server, hf):
    from lm_eval import utils  # the test extra's lm-eval
    assert utils.check_remote_tokenizer_support(server.base_url + "/v1/completions")
    remote = utils.RemoteTokenizer(server.base_url + "/v1/completions")
    assert remote.encode(TEXT) == hf.encode(TEXT, add_special_tokens=False)
    assert remote.decode(remote.encode(TEXT)) == TEXT
    assert remote.eos_token_id == hf.eos_token_id
    # lm-eval renders the served template itself (the demo template names `tools`)
    assert remote.apply_chat_template(MESSAGES, tools=None) == hf.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=False)


@pytest.mark.parametrize("path, body, param", [
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/tokenize", {"messages": []}, "messages"),
    ("/tokenize", {"messages": MESSAGES, "continue_final_message": True}, "continue_final_message"),
    ("/tokenize", {"prompt": "x", "model": "nope"}, "model"),
    ("/detokenize", {"tokens": [10**7]}, "tokens"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {}, "tokens"),
])
def test_bad_input_is_a_clear_400(server, path, body, param):
    r = _post(server, path, body)
    assert r.status_code in (400, 404), r.text
    err = r.json()["error"]
    assert (err["param"] or "").startswith(param) or f"`{param}`" in err["message"], err
