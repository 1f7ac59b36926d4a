"""The sampler's greedy fast path: the C row argmax gives torch's first maximum on bf16 and fp32 logits, and the
per-batch parameter cache never skips what a request asks for when the batch or a request's state changes."""
from __future__ import annotations

import pytest
import torch

from modelcall.core import Request, SamplingParams, ScheduledChunk
from modelcall.plugins.sampler import row_argmax
from modelcall.plugins.sampler.sampler import TorchSampler

pytestmark = pytest.mark.skipif(row_argmax._LIB.get() is None, reason="no C compiler: torch's argmax runs")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_row_argmax_is_the_first_maximum_on_ragged_tied_and_strided_rows(dtype):
    gen = torch.Generator().manual_seed(0)
    for trial in range(60):
        rows, vocab = int(torch.randint(1, 40, (), generator=gen)), int(torch.randint(1, 2100, (), generator=gen))
        x = torch.randint(-3, 4, (rows, vocab), generator=gen).to(dtype)   # few values: ties everywhere
        assert torch.equal(row_argmax.row_argmax(x), x.max(-1).indices), (trial, rows, vocab)
    wide = torch.randn(6, 32000 + 77, generator=gen).to(dtype)
    view = wide[:, 5:32005]            # row stride 32077, not the row length
    view[1, 31999] = view[1, 3] = 50.0   # a tie in the first and the last block: the first wins
    view[2, 256] = view[2, 255] = 50.0   # across a block boundary
    assert row_argmax.usable(view)
    assert torch.equal(row_argmax.row_argmax(view), view.max(-1).indices)


def test_row_argmax_ranks_infinities_as_torch_does():
    x = torch.full((4, 700), float("-inf"))
    x[1, 699] = -1e30
    x[2, 3] = float("inf")
    x[2, 500] = float("inf")
    x[3, :] = 2.0
    for t in (x, x.to(torch.bfloat16)):
        assert row_argmax.row_argmax(t).tolist() == t.max(-1).indices.tolist() == [0, 699, 3, 0]


def _chunk(rid: str, output=(), eos=frozenset({0}), **params) -> ScheduledChunk:
    req = Request(rid, [1, 2, 3], SamplingParams(**params), max_tokens=100, eos_token_ids=eos)
    req.all_token_ids.extend(output)
    return ScheduledChunk(req, 1, True)


def test_greedy_batch_cache_follows_the_batch_and_each_requests_state():
    vocab = 300
    x = torch.randn(3, vocab, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    x[:, 0] = 5.0   # token 0 (eos) is every row's maximum (randn stays below 4.5 here)
    s = TorchSampler()
    plain = [_chunk("a", temperature=0), _chunk("b", temperature=0), _chunk("c", temperature=0)]
    assert s.sample(x, plain) == ([0, 0, 0], None)
    # the same requests, one now owing min_tokens: eos is forbidden for it until its third output token
    waiting = _chunk("d", temperature=0, min_tokens=3)
    batch = [plain[0], waiting, plain[2]]
    second = int(x[1, 1:].float().argmax()) + 1
    assert s.sample(x, batch)[0] == [0, second, 0]
    waiting.request.all_token_ids.extend([5, 6])
    assert s.sample(x, batch)[0] == [0, second, 0]      # same batch, 2 of 3 outputs: still forbidden
    waiting.request.all_token_ids.append(7)
    assert s.sample(x, batch)[0] == [0, 0, 0]           # min_tokens reached
    # a processor added to a request of an unchanged batch is applied
    plain[2].request.logits_processors.append(lambda ids, row: row.index_fill_(0, torch.tensor([0]), -1e9))
    assert s.sample(x, batch)[0][2] == int(x[2, 1:].float().argmax()) + 1
    # a batch that changes to hold a penalty or a logprobs request leaves the fast path
    pen = _chunk("e", output=(0, 0, 0), temperature=0, frequency_penalty=2.0)   # 5 - 3 x 2
    assert s.sample(x[:2], [plain[0], pen])[0][1] != 0
    tokens, lps = s.sample(x[:2], [plain[0], _chunk("f", temperature=0, logprobs=1)])
    assert tokens == [0, 0] and lps[1] is not None and lps[0] is None
    assert s.sample(x[:2], plain[:2]) == ([0, 0], None)
