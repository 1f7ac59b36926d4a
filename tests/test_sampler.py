"""The batched sampler: each sampling parameter changes what it should, seeds are reproducible
whatever else is in the batch, and logprobs come from the raw model distribution."""
from __future__ import annotations

import anyio
import pytest
import torch

from modelcall.core import Kernel, Request, SamplingParams, ScheduledChunk
from modelcall.plugins.sampler.sampler import TorchSampler

VOCAB = 64


def chunk(prompt=(1, 2, 3), output=(), eos=frozenset({0}), **params) -> ScheduledChunk:
    req = Request("r", list(prompt), SamplingParams(**params), max_tokens=100, eos_token_ids=eos)
    req.all_token_ids.extend(output)
    return ScheduledChunk(req, 1, True)


def logits_rows(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def draw(c: ScheduledChunk, logits: torch.Tensor, times: int) -> list[int]:
    s = TorchSampler()
    return [s.sample(logits.clone(), [c])[0][0] for _ in range(times)]


def test_greedy_temperature_zero_and_top_k_one_pick_the_argmax():
    x = logits_rows(5)
    best = x.argmax(-1).tolist()
    s = TorchSampler()
    assert s.sample(x, [chunk(temperature=0) for _ in range(5)]) == (best, None)
    assert s.sample(x, [chunk(temperature=0.8, top_k=1) for _ in range(5)])[0] == best
    mixed = [chunk(temperature=0), chunk(temperature=1.0, seed=1), chunk(temperature=0), chunk(top_k=1),
             chunk(temperature=0)]
    out = s.sample(x, mixed)[0]
    assert [out[i] for i in (0, 2, 3, 4)] == [best[i] for i in (0, 2, 3, 4)]


def test_fast_argmax_equals_max_including_ties():
    from modelcall.plugins.sampler.sampler import argmax
    for dtype in (torch.float32, torch.bfloat16):
        for vocab in (32000, 5000, 50):
            x = torch.randn(7, vocab, generator=torch.Generator().manual_seed(vocab)).to(dtype)
            x[2, 10] = x[2, vocab - 3] = 40.0     # a tie across blocks: the first wins
            x[4, 300 % vocab] = x[4, 301 % vocab] = 40.0   # and within one block
            assert torch.equal(argmax(x), x.max(-1).indices)


def test_same_seed_same_tokens_whatever_the_batch():
    x = logits_rows(4, seed=1)
    a = chunk(temperature=1.0, seed=42)
    alone = [TorchSampler().sample(x[2:3], [a])[0][0] for _ in range(1)]
    a2 = chunk(temperature=1.0, seed=42)
    s = TorchSampler()
    seq_alone = [s.sample(x[2:3], [a2])[0][0] for _ in range(20)]
    a3 = chunk(temperature=1.0, seed=42)
    seq_batched = [s.sample(x, [chunk(temperature=1.0), chunk(temperature=0.5, seed=7), a3, chunk(temperature=0)])[0][2]
                   for _ in range(20)]
    assert seq_alone == seq_batched and seq_alone[0] == alone[0]
    other = chunk(temperature=1.0, seed=43)
    assert [s.sample(x[2:3], [other])[0][0] for _ in range(20)] != seq_alone
    assert len(set(seq_alone)) > 1   # it does sample


def test_temperature_spreads_and_sharpens():
    x = logits_rows(1, seed=2)
    hot = draw(chunk(temperature=5.0), x, 300)
    cold = draw(chunk(temperature=0.05), x, 300)
    assert len(set(hot)) > 3 * len(set(cold))
    assert max(set(cold), key=cold.count) == x.argmax().item()


def test_top_k_keeps_only_the_k_most_likely():
    x = logits_rows(1, seed=3)
    allowed = set(x[0].topk(3).indices.tolist())
    got = set(draw(chunk(temperature=3.0, top_k=3), x, 300))
    assert got <= allowed and len(got) == 3


def test_top_p_keeps_the_nucleus():
    x = torch.full((1, VOCAB), -10.0)
    x[0, [5, 9, 11]] = torch.tensor([2.0, 1.0, 0.0]).log_softmax(-1) + 10   # p ~ 0.67, 0.24, 0.09
    got = set(draw(chunk(temperature=1.0, top_p=0.8), x, 300))
    assert got == {5, 9}
    assert set(draw(chunk(temperature=1.0, top_p=0.5), x, 50)) == {5}   # the top token always stays


def test_mixed_top_k_and_top_p_rows_keep_exactly_their_sets():
    """Each row's distribution keeps the tokens a per-row sort says it should (top-k first, then the smallest
    prefix reaching top-p), with and without a row that has no top-k (the full-sort path), and renormalises."""
    x = logits_rows(5, seed=7)
    settings = [(3, 1.0), (10, 0.5), (1, 1.0), (40, 0.9), (0, 0.7)]
    for rows in (settings[:4], settings):
        reqs = [chunk(temperature=0.7, top_k=k, top_p=p).request for k, p in rows]
        probs = TorchSampler.target_probs(x[:len(rows)].clone(), reqs)
        for i, (k, p) in enumerate(rows):
            order = (x[i] / 0.7).sort(descending=True).indices.tolist()[:k or VOCAB]
            mass = (x[i, order] / 0.7).softmax(-1).tolist()
            keep, acc = [], 0.0
            for t, m in zip(order, mass):
                if keep and acc >= p:
                    break
                keep.append(t)
                acc += m
            assert set(probs[i].nonzero().squeeze(1).tolist()) == set(keep), (k, p)
            assert abs(probs[i].sum().item() - 1.0) < 1e-5


def test_min_p_drops_tokens_below_a_share_of_the_best():
    x = torch.full((1, VOCAB), -10.0)
    x[0, [3, 4, 6]] = torch.tensor([0.5, 0.3, 0.05]).log()
    got = set(draw(chunk(temperature=1.0, min_p=0.2), x, 300))
    assert got == {3, 4}


def test_penalties_push_down_tokens_already_seen():
    x = torch.zeros(1, VOCAB)
    x[0, 7], x[0, 8] = 2.0, 1.9
    s = TorchSampler()
    assert s.sample(x, [chunk(temperature=0)])[0] == [7]
    assert s.sample(x, [chunk(temperature=0, output=(7,), presence_penalty=0.5)])[0] == [8]
    assert s.sample(x, [chunk(temperature=0, output=(7, 7, 7), frequency_penalty=0.1)])[0] == [8]
    assert s.sample(x, [chunk(temperature=0, output=(7,), frequency_penalty=0.05)])[0] == [7]
    # repetition penalty covers the prompt too (as in HF): divide positive logits
    assert s.sample(x, [chunk(prompt=(7, 1), temperature=0, repetition_penalty=1.2)])[0] == [8]
    assert s.sample(x, [chunk(prompt=(1, 2), temperature=0, repetition_penalty=1.2)])[0] == [7]
    # penalties of one request leave its batch-mates alone
    both = s.sample(torch.cat([x, x]), [chunk(temperature=0, output=(7,), presence_penalty=1.0), chunk(temperature=0)])
    assert both[0] == [8, 7]


def test_penalty_counts_kept_between_steps_equal_a_fresh_count():
    """The counts a request keeps across steps (updated with each step's new tokens) penalise exactly as counts
    made from scratch for a request holding the same tokens; a shortened token list is recounted."""
    x = logits_rows(1, seed=5)
    penalties = dict(temperature=0, frequency_penalty=0.3, presence_penalty=0.2, repetition_penalty=1.3)
    kept = chunk(prompt=(3, 4, 3), **penalties)

    def same_as_fresh() -> torch.Tensor:
        fresh = chunk(prompt=(3, 4, 3), output=kept.request.output_token_ids, **penalties)
        a, b = x.clone(), x.clone()
        TorchSampler._penalize(a, [kept.request], torch.tensor([0]))
        TorchSampler._penalize(b, [fresh.request], torch.tensor([0]))
        assert torch.equal(a, b)
        return a

    for t in (4, 9, 9, 3, 63, 9):
        kept.request.all_token_ids.append(t)
        assert not torch.equal(same_as_fresh(), x)
    del kept.request.all_token_ids[-3:]      # e.g. rolled back
    same_as_fresh()


def test_logits_processors_run_before_choosing():
    x = logits_rows(2, seed=4)
    c = chunk(temperature=0, output=(5,))
    seen = []

    def only_token_9(output_ids, row):
        seen.append(list(output_ids))
        row[:] = float("-inf")
        row[9] = 0.0

    c.request.logits_processors.append(only_token_9)
    out, _ = TorchSampler().sample(x, [c, chunk(temperature=0)])
    assert out == [9, x[1].argmax().item()] and seen == [[5]]


def test_min_tokens_forbids_ending_early():
    x = torch.zeros(1, VOCAB)
    x[0, 0] = 5.0   # the EOS
    s = TorchSampler()
    assert s.sample(x, [chunk(temperature=0, min_tokens=2, output=(4,))])[0] != [0]
    assert s.sample(x, [chunk(temperature=0, min_tokens=2, output=(4, 4))])[0] == [0]
    x[0, 0], x[0, 12] = 0.0, 5.0
    assert s.sample(x, [chunk(temperature=0, min_tokens=1, stop_token_ids=(12,))])[0] != [12]


def test_logprobs_are_raw_and_top_n_sorted():
    x = logits_rows(3, seed=5)
    s = TorchSampler()
    chunks = [chunk(temperature=0, logprobs=5), chunk(temperature=0.7, seed=3, logprobs=0, presence_penalty=1.0),
              chunk(temperature=0)]
    tokens, lps = s.sample(x, chunks)
    raw = x.log_softmax(-1)
    assert len(lps) == 3 and lps[2] is None
    first = lps[0]
    assert first.token_id == tokens[0] and first.logprob == pytest.approx(raw[0, tokens[0]].item(), abs=1e-6)
    assert len(first.top) == 5 and [t.token_id for t in first.top] == raw[0].topk(5).indices.tolist()
    assert all(a.logprob >= b.logprob for a, b in zip(first.top, first.top[1:]))
    assert lps[1].top == () and lps[1].logprob == pytest.approx(raw[1, tokens[1]].item(), abs=1e-6)


def test_seeded_text_through_the_kernel_is_reproducible(demo_model_dir):
    async def main():
        async with Kernel(model=demo_model_dir, dtype="float32", threads=1, num_kv_blocks=256) as kernel:
            await anyio.sleep(0)
            texts: dict[str, str] = {}

            async def one(key: str, params: dict) -> None:
                texts[key] = (await kernel.complete("Once upon a time", max_tokens=16, **params)).text

            await one("alone", dict(temperature=1.0, seed=11))
            async with anyio.create_task_group() as tg:
                tg.start_soon(one, "batched", dict(temperature=1.0, seed=11))
                tg.start_soon(one, "other", dict(temperature=1.0, seed=12))
                tg.start_soon(one, "noise", dict(temperature=1.3))
                tg.start_soon(one, "greedy", dict(temperature=0.0))
            # NOTE: the demo model never repeats a token greedily, so a penalty against repeats changes nothing;
            # a negative one (a reward) must.
            await one("penalized", dict(temperature=0.0, frequency_penalty=-2.0))
            return texts

    t = anyio.run(main)
    assert t["alone"] == t["batched"] and t["alone"] != t["other"]
    assert t["penalized"] != t["greedy"]
