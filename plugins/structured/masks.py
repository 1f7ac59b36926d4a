"""Token masks: bitmasks from llguidance applied to logits rows, and computed ahead of need.

    engine step N:  forward ──▶ sample (waits for masks of step N) ──▶ apply ──▶ publish
                                                                         │
                    observe(TokensEmitted): note each constrained request's new token
                    observe(StepDone): one job for all of them ─▶ worker thread: consume the
                    tokens, compute every next mask at once (llguidance's parallel executor,
                    GIL released) ─── runs while step N+1's forward runs ───▶ ready for its sampler

NOTE: a processor always checks that the mask it gets was computed after exactly the tokens the
sampler shows it; if not (a token the observer missed), it catches up inline. Correctness never
depends on the prefetch, only speed.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

log = logging.getLogger("modelcall.structured")
_BITS = torch.tensor([1 << i for i in range(32)], dtype=torch.int64)


def allowed_from_bitmask(words: torch.Tensor, vocab: int) -> torch.Tensor:
    """[W] int32 bitmask words -> [vocab] bool (token i allowed when bit i%32 of word i//32 is set)."""
    bits = (words.to(torch.int64).unsqueeze(-1) & _BITS) != 0
    flat = bits.reshape(-1)
    if flat.numel() >= vocab:
        return flat[:vocab]
    return torch.cat([flat, torch.zeros(vocab - flat.numel(), dtype=torch.bool)])


class GrammarProcessor:
    """The logits processor of one constrained request: keeps only tokens the grammar allows
    (and the request's end-of-sequence tokens once the grammar may end)."""

    def __init__(self, matcher: Any, num_words: int, eos_token_ids: frozenset[int], request_id: str) -> None:
        self.matcher = matcher
        self.num_words = num_words
        self.eos = sorted(eos_token_ids)
        self.request_id = request_id
        self.consumed = 0                     # output tokens the matcher has taken
        self.pending: list[int] = []          # tokens seen by the observer, not yet consumed
        self.mask: torch.Tensor | None = None  # the bitmask after `mask_at` tokens
        self.mask_at = -1
        self.future: Future | None = None
        self.lock = threading.Lock()
        self.inline_masks = 0                 # masks computed on the critical path (for stats)

    # ---- worker side ----------------------------------------------------------------------

    def advance(self) -> None:
        """Consume pending tokens (under the lock)."""
        toks, self.pending = self.pending, []
        for t in toks:
            if not self.matcher.consume_token(t):
                log.warning("request %s: token %d rejected by its grammar: %s", self.request_id, t,
                            self.matcher.get_error())
        self.consumed += len(toks)

    # ---- sampler side ---------------------------------------------------------------------

    def __call__(self, output_token_ids: Sequence[int], row: torch.Tensor) -> None:
        fut = self.future
        if fut is not None:
            fut.result()
        with self.lock:
            n = len(output_token_ids)
            if self.mask_at != n:  # NOTE: the prefetch missed this position: catch up inline
                if n < self.consumed:
                    self.matcher.rollback(self.consumed - n)
                    self.consumed, self.pending = n, []
                self.pending = list(output_token_ids[self.consumed:n])
                self.advance()
                self.mask = torch.full((self.num_words,), -1, dtype=torch.int32)
                self.matcher.unsafe_compute_mask_ptr(self.mask.data_ptr(), self.num_words * 4)
                self.mask_at = n
                self.inline_masks += 1
            allowed = allowed_from_bitmask(self.mask, row.shape[-1])
            if self.matcher.is_error():
                allowed = torch.zeros_like(allowed)
            if self.matcher.is_accepting() or self.matcher.is_error():
                allowed[[t for t in self.eos if t < allowed.numel()]] = True
            row.masked_fill_(~allowed, float("-inf"))


class MaskPrefetcher:
    """Computes the next masks of every constrained request right after each step, in one batch,
    on a worker thread, so they are ready before the sampler asks."""

    def __init__(self, executor: Any, num_words: int) -> None:
        self.executor = executor          # llguidance.LLExecutor
        self.num_words = num_words
        self.active: dict[str, GrammarProcessor] = {}
        self._dirty: list[GrammarProcessor] = []
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="modelcall-masks")

    def add(self, p: GrammarProcessor) -> None:
        self.active[p.request_id] = p
        self._submit([p])

    def on_tokens(self, request_id: str, token_ids: Sequence[int]) -> None:
        p = self.active.get(request_id)
        if p is not None and token_ids:
            with p.lock:  # NOTE: free in practice: the sampler already waited for this request's job
                p.pending.extend(token_ids)
            self._dirty.append(p)

    def on_step(self) -> None:
        if self._dirty:
            batch, self._dirty = list(dict.fromkeys(self._dirty)), []
            self._submit(batch)

    def on_end(self, request_id: str) -> None:
        self.active.pop(request_id, None)

    def _submit(self, batch: list[GrammarProcessor]) -> None:
        fut = self._pool.submit(self._compute, batch)
        for p in batch:
            p.future = fut

    def _compute(self, batch: list[GrammarProcessor]) -> None:
        for p in batch:
            p.lock.acquire()
        try:
            for p in batch:
                p.advance()
            masks = torch.full((len(batch), self.num_words), -1, dtype=torch.int32)
            self.executor.unsafe_compute_mask_ptr([(p.matcher, i) for i, p in enumerate(batch)],
                                                  masks.data_ptr(), self.num_words * 4, len(batch))
            for i, p in enumerate(batch):
                p.mask, p.mask_at = masks[i], p.consumed
        except Exception:  # the processor recomputes inline; never let the worker die silently
            log.exception("mask prefetch failed")
        finally:
            for p in batch:
                p.lock.release()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
