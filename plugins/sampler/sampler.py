"""TorchSampler: picks the next token of every row of a step's logits at once.

Order per row, as in vLLM and HF: min_tokens (forbid stop tokens) → logits processors →
penalties → (greedy: argmax) | temperature → top-k → top-p → min-p → draw. Logprobs are those
of the raw model distribution (vLLM's default), computed before any of that.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from modelcall.events import PositionLogprobs, TokenLogprob
from modelcall.plugins.sampler import row_argmax
from modelcall.plugins.sampler.verify import verify as verify_draft
from modelcall.plugins.sampler.verify import verify_many as verify_drafts

NEG_INF = float("-inf")


def _has_penalty(p: Any) -> bool:
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


def _forbidden(req: Any) -> list[int]:
    """Token ids a request may not end with yet (min_tokens not reached)."""
    p = req.params
    if req.num_output_tokens >= p.min_tokens:
        return []
    ids = list(p.stop_token_ids)
    if not p.ignore_eos:
        ids.extend(req.eos_token_ids)
    return ids


class TorchSampler:
    """Batched sampling on [n, vocab] logits; per-request state is a seeded generator in `sampler_state`."""

    # Decode bursts may run on it (core.stages.Sampler): only penalties, min_tokens and processors read a request's
    # tokens, and core/burst.py keeps requests using any of them out of bursts
    burst_safe = True
    # a greedy request's token is its logits row's first maximum (argmax below): a runner may take it itself
    greedy_argmax = True

    def __init__(self) -> None:
        self._batch: list[Any] = []          # the requests of the last batch, in order
        self._batch_greedy = False           # all of them greedy with no logprobs and no penalty
        self._batch_min_tokens: list[Any] = []   # those of them with a min_tokens

    def sample(self, logits: torch.Tensor, chunks: Sequence[Any]) -> tuple[list[int], list[Any] | None]:
        reqs = [c.request for c in chunks]
        if self._plain_greedy(reqs):
            return argmax(logits).tolist(), None
        params = [r.params for r in reqs]
        want_lp = any(p.logprobs is not None for p in params)
        forbid = [_forbidden(r) for r in reqs]
        processed = any(forbid) or any(r.logits_processors for r in reqs) or any(_has_penalty(p) for p in params)
        logits = logits.float()
        raw_logprobs = torch.log_softmax(logits, -1) if want_lp else None
        x = logits.clone() if processed else logits
        if processed:
            self._process(x, reqs, forbid)
        tokens = self._choose(x, reqs)
        if raw_logprobs is None:
            return tokens.tolist(), None
        return self._logprobs(raw_logprobs, tokens, params)

    def _plain_greedy(self, reqs: list[Any]) -> bool:
        """Every row is a plain argmax: greedy, no logprobs, penalties, processors or pending min_tokens.

        NOTE: what depends only on a request's (frozen) params is read again only when the batch changes (a
        decode batch is the same requests step after step); processors and min_tokens are checked every step."""
        if reqs != self._batch:   # identity, element by element
            self._batch = reqs
            self._batch_greedy = all(r.params.greedy and r.params.logprobs is None and not _has_penalty(r.params)
                                     for r in reqs)
            self._batch_min_tokens = [r for r in reqs if r.params.min_tokens > 0]
        if not self._batch_greedy or any(r.logits_processors for r in reqs):
            return False
        return not any(_forbidden(r) for r in self._batch_min_tokens)

    # ---- logits processing --------------------------------------------------------------------

    def _process(self, x: torch.Tensor, reqs: list[Any], forbid: list[list[int]]) -> None:
        for i, ids in enumerate(forbid):
            if ids:
                x[i, [t for t in ids if t < x.shape[1]]] = NEG_INF
        for i, r in enumerate(reqs):
            if r.logits_processors:
                out_ids = r.output_token_ids
                for fn in r.logits_processors:
                    row = fn(out_ids, x[i])
                    if row is not None and row is not x[i]:
                        x[i] = row
        rows = [i for i, r in enumerate(reqs) if _has_penalty(r.params)]
        if rows:
            self._penalize(x, [reqs[i] for i in rows], torch.tensor(rows, device=x.device))

    @staticmethod
    def _penalize(x: torch.Tensor, reqs: list[Any], rows: torch.Tensor) -> None:
        """Presence/frequency over output tokens, repetition over prompt + output (as HF and vLLM)."""
        dev = x.device
        sub = x.index_select(0, rows)
        state = [_penalty_counts(r, x.shape[1], dev) for r in reqs]
        counts = torch.stack([c.counts for c in state])
        rep = torch.tensor([r.params.repetition_penalty for r in reqs], device=dev)[:, None]
        if any(r.params.repetition_penalty != 1.0 for r in reqs):
            seen = torch.stack([c.seen for c in state])
            sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
        freq = torch.tensor([r.params.frequency_penalty for r in reqs], device=dev)[:, None]
        pres = torch.tensor([r.params.presence_penalty for r in reqs], device=dev)[:, None]
        sub = sub - freq * counts - pres * (counts > 0)
        x.index_copy_(0, rows, sub)

    # ---- choosing -----------------------------------------------------------------------------

    def _choose(self, x: torch.Tensor, reqs: list[Any]) -> torch.Tensor:
        tokens = argmax(x)
        rows = [i for i, r in enumerate(reqs) if not r.params.greedy]
        if rows:
            idx = torch.tensor(rows, device=x.device)
            drawn = self._draw(x.index_select(0, idx), [reqs[i] for i in rows])
            tokens.index_copy_(0, idx, drawn)
        return tokens     # on the device: the caller copies it to the host once

    def _draw(self, x: torch.Tensor, reqs: list[Any]) -> torch.Tensor:
        dev = x.device
        ps = [r.params for r in reqs]
        probs = self.target_probs(x, reqs)
        # NOTE: argmax(p / E) with E ~ Exp(1) draws from p (the exponential race); each seeded request
        # draws its noise from its own generator, so its text does not depend on its batch-mates.
        noise = torch.empty_like(probs)
        seeded = [k for k, p in enumerate(ps) if p.seed is not None]
        if len(seeded) < len(ps):
            noise.exponential_()
        for k in seeded:
            noise[k].exponential_(generator=self._generator(reqs[k], dev))
        return (probs / noise).max(-1).indices

    def verify(self, logits: torch.Tensor, chunk: Any) -> list[int]:
        """Speculative decoding: the tokens `chunk.request` appends after its draft was checked at the
        draft's 1 + k rows of `logits` (plugins/sampler/verify.py): the accepted prefix, then one more."""
        return verify_draft(self, logits, chunk, argmax, self.target_probs)

    def verify_many(self, logits: torch.Tensor, chunks: Sequence[Any]) -> list[list[int]]:
        """`verify` of several drafted chunks at once, their rows back to back in `logits` (one argmax)."""
        return verify_drafts(self, logits, list(chunks), argmax, self.target_probs)

    @staticmethod
    def target_probs(x: torch.Tensor, reqs: list[Any]) -> torch.Tensor:
        """The distribution `_draw` samples row i from (temperature, top-k, top-p, min-p), as probabilities."""
        dev, vocab = x.device, x.shape[1]
        ps = [r.params for r in reqs]
        x = x / torch.tensor([p.temperature for p in ps], device=dev)[:, None]
        top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in ps]
        if min(top_k) < vocab or any(p.top_p < 1.0 for p in ps):
            x = _top_k_top_p(x, top_k, [p.top_p for p in ps])
        probs = torch.softmax(x, -1)
        if any(p.min_p > 0.0 for p in ps):
            min_p = torch.tensor([p.min_p for p in ps], device=dev)[:, None]
            probs = probs.masked_fill(probs < min_p * probs.max(-1, keepdim=True).values, 0.0)
        return probs

    @staticmethod
    def _generator(req: Any, device: torch.device) -> torch.Generator:
        g = req.sampler_state
        if not isinstance(g, torch.Generator) or g.device != device:
            g = torch.Generator(device=device)
            g.manual_seed(req.params.seed)
            req.sampler_state = g
        return g

    # ---- logprobs -----------------------------------------------------------------------------

    @staticmethod
    def prompt_logprobs(logits: torch.Tensor, targets: Sequence[int], num_top: int,
                        rows_per_block: int = 32) -> tuple[list[Any], list[int]]:
        """Score given tokens: row i's log-probability of `targets[i]` under the raw model distribution
        (as sampled logprobs: before any penalty or processor), its rank (1: the most likely), and the
        `num_top` most likely tokens there. `logits` is [len(targets), vocab].

        NOTE: a few rows at a time (log-sum-exp, the target's logit, the count of larger logits, top-k)
        so the passes over a block stay in cache: 2.5x faster on CPU than log_softmax over all rows.
        """
        tgt = torch.tensor(list(targets), device=logits.device)[:, None]
        chosen, ranks, top_v, top_i = [], [], [], []
        for a in range(0, len(targets), rows_per_block):
            x = logits[a:a + rows_per_block].float()
            t = tgt[a:a + rows_per_block]
            lse = torch.logsumexp(x, -1, keepdim=True)
            tv = x.gather(1, t)
            chosen.append(tv - lse)
            ranks.append((x > tv).sum(-1, dtype=torch.int32) + 1)
            if num_top:
                v, i = x.topk(num_top, dim=-1)
                top_v.append(v - lse)
                top_i.append(i)
        values = torch.cat(chosen).squeeze(1).tolist()
        if num_top:
            tv_, ti_ = torch.cat(top_v).tolist(), torch.cat(top_i).tolist()
            tops = [tuple(TokenLogprob(t, x) for t, x in zip(ti, tv)) for ti, tv in zip(ti_, tv_)]
        else:
            tops = [()] * len(values)
        scored = [PositionLogprobs(token_id=t, logprob=x, top=top) for t, x, top in zip(targets, values, tops)]
        return scored, torch.cat(ranks).tolist()

    @staticmethod
    def _logprobs(lp: torch.Tensor, tokens_t: torch.Tensor, params: list[Any]) -> tuple[list[int], list[Any]]:
        """The chosen tokens and their logprobs (and top alternatives), copied to the host in one transfer.

        NOTE: one float64 block [token, its logprob, top values, top ids] per row: a single device-to-host
        sync per step on CUDA instead of four; token ids (< 2**53) and fp32 logprobs are exact in float64.
        """
        n_top = max(p.logprobs or 0 for p in params)
        cols = [tokens_t[:, None].double(), lp.gather(1, tokens_t[:, None]).double()]
        if n_top:
            v, i = lp.topk(n_top, dim=-1)   # sorted, most likely first
            cols += [v.double(), i.double()]
        host = torch.cat(cols, 1).tolist()
        tokens = [int(row[0]) for row in host]
        chosen = [row[1] for row in host]
        top_v = [row[2:2 + n_top] for row in host] if n_top else None
        top_i = [[int(t) for t in row[2 + n_top:]] for row in host] if n_top else None
        out: list[Any] = []
        for k, p in enumerate(params):
            if p.logprobs is None:
                out.append(None)
                continue
            top = ()
            if p.logprobs and top_v is not None:
                top = tuple(TokenLogprob(t, l) for t, l in zip(top_i[k][:p.logprobs], top_v[k][:p.logprobs]))
            out.append(PositionLogprobs(token_id=tokens[k], logprob=chosen[k], top=top))
        return tokens, out


class PenaltyCounts:
    """One request's token counts for penalties, kept between steps and updated with the tokens appended since
    (instead of rebuilt from every output token each step): `counts` of output tokens, `seen` prompt + output."""

    def __init__(self, vocab: int, device: torch.device) -> None:
        self.counts = torch.zeros(vocab, device=device)
        self.seen = torch.zeros(vocab, dtype=torch.bool, device=device)
        self.upto = 0          # all_token_ids[:upto] are counted
        self.prompt = 0        # num_prompt_tokens when counted (a new prompt: start again)


PENALTY_STATE = "sampler.penalty_counts"


def _penalty_counts(req: Any, vocab: int, device: torch.device) -> PenaltyCounts:
    st = req.extra.get(PENALTY_STATE)
    total, prompt = len(req.all_token_ids), req.num_prompt_tokens
    # NOTE: a rejected speculative draft or a rewound request can shorten all_token_ids: recount from scratch
    if st is None or st.upto > total or st.prompt != prompt or st.counts.shape[0] != vocab or st.counts.device != device:
        st = req.extra[PENALTY_STATE] = PenaltyCounts(vocab, device)
        st.prompt = prompt
    if st.upto < total:
        new = req.all_token_ids[st.upto:total]
        ids = torch.tensor([t for t in new if t < vocab], dtype=torch.long, device=device)
        st.seen[ids] = True
        out = [t for t in req.all_token_ids[max(st.upto, prompt):total] if t < vocab]
        if out:
            st.counts.index_put_((torch.tensor(out, dtype=torch.long, device=device),),
                                 torch.ones(len(out), device=device), accumulate=True)
        st.upto = total
    return st


def argmax(x: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """Row-wise index of the first maximum, as `x.max(-1).indices`, faster on CPU.

    NOTE: torch's max-with-index over 32000 columns is a scalar loop (~0.9 ms for 32 rows here, more
    than `argmax` would suggest and 2-3% of a decode step). On CPU the C kernel of row_argmax.py reads the
    bf16 logits once (W1, 32 x 32,000: 66 us); without it, the vectorized `amax` over fixed-size column
    blocks finds the block holding each row's first maximum, then a max within that block (~200 us,
    40% of it the conversion to fp32).
    """
    n, vocab = x.shape
    if row_argmax.usable(x):
        return row_argmax.row_argmax(x)
    if x.device.type != "cpu" or vocab < 16 * chunk:
        return x.max(-1).indices
    x = x.float()
    if vocab % chunk:
        x = torch.nn.functional.pad(x, (0, chunk - vocab % chunk), value=NEG_INF)
    blocks = x.view(n, -1, chunk)
    best = blocks.amax(-1).max(-1).indices                       # first block holding the row maximum
    inner = blocks[torch.arange(n), best].max(-1).indices
    return best * chunk + inner


def _top_k_top_p(x: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Keep each row's `top_k` largest logits, then the smallest set whose probability reaches `top_p`.

    NOTE: when every row has a top-k below the vocabulary, only the largest max(top_k) logits of each row are
    selected and sorted (torch.topk), not the whole row: top-p only ever looks at what top-k kept (W1's vocab,
    32 rows, top_k 50: a full sort of 32 x 32,000 against a top-50 selection)."""
    dev = x.device
    vocab = x.shape[1]
    if max(top_k) < vocab:
        sorted_x, order = x.topk(max(top_k), dim=-1)      # sorted, largest first
    else:
        sorted_x, order = x.sort(-1, descending=True)
    vocab = sorted_x.shape[1]
    ranks = torch.arange(vocab, device=dev)[None, :]
    drop = ranks >= torch.tensor(top_k, device=dev)[:, None]
    sorted_x = sorted_x.masked_fill(drop, NEG_INF)
    p = torch.tensor(top_p, device=dev)[:, None]
    if any(v < 1.0 for v in top_p):   # decided on the host: `(p < 1.0).any()` would sync with the device
        probs = sorted_x.softmax(-1)
        before = probs.cumsum(-1) - probs          # mass of strictly more likely tokens
        sorted_x = sorted_x.masked_fill((before >= p) & (ranks > 0), NEG_INF)
    return torch.full_like(x, NEG_INF).scatter_(1, order, sorted_x)
