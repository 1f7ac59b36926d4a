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

On CPU the sampler gets the unpacked mask the worker made. On a GPU it gets the packed words (vocab/8
bytes) through a pinned buffer, copied without blocking and unpacked on the device (issue 16).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

log = logging.getLogger("modelcall.structured")
_SHIFTS: dict[torch.device, torch.Tensor] = {}


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
        self.words: torch.Tensor | None = None    # allowed-token bitmask after `mask_at` output tokens
        self.blocked: torch.Tensor | None = None  # the same, unpacked: True where a token is forbidden
        self.mask_at = -1
        self._staging: torch.Tensor | None = None  # pinned host copy of `words` (off-CPU devices only)
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
                mask = torch.full((1, self.num_words), -1, dtype=torch.int32)
                self.matcher.unsafe_compute_mask_ptr(mask.data_ptr(), self.num_words * 4)
                words = adjusted_words(mask, [self])
                self.words, self.blocked, self.mask_at = words[0], unpack_blocked(words)[0], n
                self.inline_masks += 1
            blocked = self.blocked if row.device.type == "cpu" else self._on_device(row.device)
        k = min(blocked.numel(), row.shape[-1])
        row[:k].masked_fill_(blocked[:k], float("-inf"))
        if row.shape[-1] > k:  # padded vocabulary rows the tokenizer does not know
            row[k:] = float("-inf")


    def _on_device(self, device: torch.device) -> torch.Tensor:
        """The forbidden-token mask on `device`: the packed words (vocab/8 bytes, not a byte per
        token) go through a pinned buffer with a non-blocking copy and are unpacked there, so the
        sampler never waits on a pageable copy. Reusing the buffer next step is safe: every step
        ends in the sampler's one host sync, after which this copy has landed."""
        if self._staging is None:
            self._staging = torch.empty(self.num_words, dtype=torch.int32, pin_memory=True)
        self._staging.copy_(self.words)
        return unpack_blocked(self._staging.to(device, non_blocking=True))


def adjusted_words(masks: torch.Tensor, procs: Sequence[GrammarProcessor]) -> torch.Tensor:
    """llguidance's [n, W] int32 bitmasks (bit i%32 of word i//32 set: token i allowed), with each
    request's end-of-sequence tokens allowed once its grammar may end; a request whose matcher is in
    error keeps only those (it stops)."""
    for i, p in enumerate(procs):
        m = p.matcher
        err = m.is_error()
        if err:
            masks[i] = 0
        if err or m.is_accepting():
            for t in p.eos:
                if t < masks.shape[1] * 32:
                    w = int(masks[i, t >> 5]) | (1 << (t & 31))
                    masks[i, t >> 5] = w - (1 << 32) if w >= 1 << 31 else w  # the int32 of those 32 bits
    return masks


def unpack_blocked(words: torch.Tensor) -> torch.Tensor:
    """[..., W] int32 allowed-token bitmask words -> [..., W*32] bool, True where a token is
    forbidden; computed on the words' own device (shifts and an AND: no host work, no table)."""
    shifts = _SHIFTS.get(words.device)
    if shifts is None:
        shifts = _SHIFTS[words.device] = torch.arange(32, dtype=torch.int32, device=words.device)
    return ((words.unsqueeze(-1) >> shifts) & 1).eq(0).flatten(-2)


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
            words = adjusted_words(masks, batch)
            blocked = unpack_blocked(words)
            for i, p in enumerate(batch):
                p.words, p.blocked, p.mask_at = words[i], blocked[i], p.consumed
        except Exception:  # the processor recomputes inline; never let the worker die silently
            log.exception("mask prefetch failed")
        finally:
            for p in batch:
                p.lock.release()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
