"""Prompt logprobs: computed in the prefill forward (through chunked prefill, never skipped by a
prefix-cache hit), equal to transformers' own; served as echo logprobs and vLLM's prompt_logprobs."""
from __future__ import annotations

import json
import math

import requests
import pytest
import torch

from modelcall.core import Kernel
from modelcall.events import Finished, PromptLogprobs, TokensEmitted

from http_server import ServerThread

pytestmark = pytest.mark.anyio

KV_GB = 1 / 16  # not the default 1 GB of KV cache: ~0.4 s to zero per kernel
TEXT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"


@pytest.fixture(scope="module")
def reference(demo_model_dir):
    """transformers' own log-probabilities of the demo model (fp32, eager), per prompt: [T-1] of token t+1."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(demo_model_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(demo_model_dir)

    def logprobs(ids: list[int]) -> tuple[list[float], list[list[int]]]:
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
        return [lp[i, ids[i + 1]].item() for i in range(len(ids) - 1)], lp.topk(3, -1).indices.tolist()

    return tok, logprobs


async def _score(kernel: Kernel, ids: list[int], **fields) -> tuple[PromptLogprobs, list]:
    scored, events = None, []
    async for ev in kernel.generate(prompt_token_ids=ids, temperature=0, **fields):
        events.append(ev)
        if type(ev) is PromptLogprobs:
            assert scored is None, "prompt logprobs are sent once"
            assert not any(type(e) is TokensEmitted for e in events), "they come before any token"
            scored = ev
    assert scored is not None
    return scored, events


@pytest.mark.parametrize("budget", [2048, 7])  # one forward, and chunked prefill of 7 tokens a step
async def test_prompt_logprobs_equal_transformers_through_chunked_prefill(demo_model_dir, reference, budget):
    tok, ref = reference
    ids = tok.encode(TEXT)
    want, top = ref(ids)
    async with Kernel(dtype="float32", kv_cache_memory_gb=KV_GB, max_model_len=512, max_num_batched_tokens=budget) as k:
        scored, _ = await _score(k, ids, max_tokens=1, prompt_logprobs=3)
    assert scored.logprobs[0] is None and len(scored.logprobs) == len(ids)
    got = [p.logprob for p in scored.logprobs[1:]]
    assert [p.token_id for p in scored.logprobs[1:]] == ids[1:]
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-4
    assert [[t.token_id for t in p.top] for p in scored.logprobs[1:]] == top[:-1]
    for p, rank in zip(scored.logprobs[1:], scored.ranks[1:]):  # rank 1 exactly when the token is the top one
        assert (rank == 1) == (p.token_id == p.top[0].token_id)


async def test_prefix_cache_hit_never_skips_asked_positions(demo_model_dir, reference):
    tok, ref = reference
    ids = tok.encode(TEXT * 2)
    want, _ = ref(ids)
    async with Kernel(dtype="float32", kv_cache_memory_gb=KV_GB, max_model_len=512, block_size=16) as k:
        first = await k.complete(prompt_token_ids=ids, max_tokens=1, temperature=0)  # caches the prompt's blocks
        assert first.usage.prompt_tokens == len(ids)
        again = await k.complete(prompt_token_ids=ids, max_tokens=1, temperature=0)
        assert again.usage.cached_tokens >= 16 * ((len(ids) - 1) // 16)  # the cache is warm ...
        scored, events = await _score(k, ids, max_tokens=1, prompt_logprobs=0)
    # ... yet every asked position was computed and scored
    assert len(scored.logprobs) == len(ids)
    assert max(abs(p.logprob - w) for p, w in zip(scored.logprobs[1:], want)) < 1e-4
    assert next(e for e in events if type(e) is Finished).usage.cached_tokens == 0


async def test_max_tokens_zero_scores_without_generating(demo_model_dir):
    async with Kernel(dtype="float32", kv_cache_memory_gb=KV_GB, max_model_len=512) as k:
        scored, events = await _score(k, k.tokenizer.encode(TEXT), max_tokens=0, prompt_logprobs=0)
        steps = k.stats()["steps"]
    fin = events[-1]
    assert type(fin) is Finished and fin.reason == "length" and fin.usage.completion_tokens == 0
    assert not any(type(e) is TokensEmitted and e.token_ids for e in events)
    assert steps == 1 and all(p is None or math.isfinite(p.logprob) for p in scored.logprobs)


async def test_max_tokens_zero_needs_prompt_logprobs(demo_model_dir):
    from modelcall.core import InvalidRequest

    async with Kernel(dtype="float32", kv_cache_memory_gb=KV_GB, max_model_len=512) as k:
        with pytest.raises(InvalidRequest, match="max_tokens"):
            await k.submit("hello", max_tokens=0)


# ---- HTTP ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(demo_model_dir):
    with ServerThread(dtype="float32", max_model_len=512) as s:
        yield s


def _post(server, path: str, body: dict) -> requests.Response:
    return requests.post(server.base_url + path, json=body, timeout=60)


def test_echo_logprobs_cover_prompt_and_completion(server, reference):
    tok, ref = reference
    ids = tok.encode(TEXT)
    want, _ = ref(ids)
    r = _post(server, "/v1/completions", {"prompt": ids, "max_tokens": 3, "echo": True, "logprobs": 2,
                                          "temperature": 0})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    n = len(ids)
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n + 3
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # the first token has no context
    assert max(abs(a - b) for a, b in zip(lp["token_logprobs"][1:n], want)) < 1e-4
    # the prompt token and its 2 alternatives (fewer entries when it is one of them)
    assert all(lp["tokens"][i] in lp["top_logprobs"][i] and 2 <= len(lp["top_logprobs"][i]) <= 3 for i in range(1, n))
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    echo = tok.decode(ids)
    assert choice["text"].startswith(echo) and lp["text_offset"][n] == len(echo)
    assert "".join(lp["tokens"][:n]) == echo


def test_max_tokens_zero_with_echo_scores_the_prompt(server, reference):
    tok, ref = reference
    ids = tok.encode(TEXT)
    want, _ = ref(ids)
    r = _post(server, "/v1/completions", {"prompt": TEXT, "max_tokens": 0, "echo": True, "logprobs": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    lp = body["choices"][0]["logprobs"]
    assert body["choices"][0]["text"] == TEXT and body["usage"]["completion_tokens"] == 0
    assert len(lp["token_logprobs"]) == len(ids)
    assert sum(lp["token_logprobs"][1:]) == pytest.approx(sum(want), abs=1e-3)


def test_vllm_prompt_logprobs_field_on_completions_and_chat(server):
    r = _post(server, "/v1/completions", {"prompt": TEXT, "max_tokens": 1, "prompt_logprobs": 2})
    assert r.status_code == 200, r.text
    plp = r.json()["choices"][0]["prompt_logprobs"]
    ids = _post(server, "/tokenize", {"prompt": TEXT, "add_special_tokens": False}).json()["tokens"]
    assert plp[0] is None and len(plp) == len(ids)
    for tid, entry in zip(ids[1:], plp[1:]):
        assert str(tid) in entry and 2 <= len(entry) <= 3
        mine = entry[str(tid)]
        assert mine["rank"] >= 1 and mine["logprob"] <= 0 and isinstance(mine["decoded_token"], str)
        best = max(entry.values(), key=lambda e: e["logprob"])
        assert best["rank"] == 1
    chat = _post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                                                   "prompt_logprobs": 0})
    assert chat.status_code == 200, chat.text
    chat_ids = _post(server, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]}).json()["tokens"]
    got = chat.json()["prompt_logprobs"]
    assert got[0] is None and [int(next(iter(e))) for e in got[1:]] == chat_ids[1:]


def test_stream_echo_sends_prompt_logprobs_first(server):
    with requests.post(server.base_url + "/v1/completions", timeout=60, stream=True,
                       json={"prompt": TEXT, "max_tokens": 2, "echo": True, "logprobs": 1, "stream": True,
                             "temperature": 0}) as r:
        frames = [json.loads(line[6:]) for line in r.iter_lines(decode_unicode=True) if line.startswith("data: {")]
    first = frames[0]["choices"][0]
    assert first["text"] == TEXT and first["logprobs"]["token_logprobs"][0] is None
    assert "".join(f["choices"][0]["text"] for f in frames if f["choices"]).startswith(TEXT)


@pytest.mark.parametrize("body, param", [
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),                       # nothing to do without echo
    ({"prompt": "x", "max_tokens": 0, "echo": True, "n": 2}, "n"),          # scoring once
    ({"prompt": "x", "n": 2, "best_of": 1}, "best_of"),                     # best_of below n
    ({"prompt": "x", "n": 1, "best_of": 2, "stream": True}, "best_of"),     # best only known at the end
    ({"prompt": "x", "suffix": "y"}, "suffix"),
    ({"prompt": "x", "prompt_logprobs": 21}, "prompt_logprobs"),
])
def test_unsupported_scoring_combinations_are_clear_400s(server, body, param):
    r = _post(server, "/v1/completions", body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_streamed_chat_refuses_prompt_logprobs_instead_of_dropping_them(server):
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "stream": True, "prompt_logprobs": 1}
    r = _post(server, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "prompt_logprobs"
