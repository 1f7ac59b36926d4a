"""One step's flattened batch: token ids, positions, KV slots, and how attention is grouped.

The runner orders the tokens of a step itself (the plan's order is restored for the output):

    flat rows:  [ paged group: chunks that read earlier K/V | fresh groups: whole new prompts ]
                  decodes and continued chunks, any q_len       grouped by equal length

    block_table (request)      slot of position p = block_table[p // block_size] * block_size
      [ 7, 2, 9 ]                                    + p % block_size
    positions 0..15 -> block 7, 16..31 -> block 2, 32.. -> block 9

A paged-group token at position p attends to its request's keys 0..p (causal, aligned
bottom-right to the chunk); a fresh group has no earlier K/V, so attention runs on the chunk's
own new K/V with a plain causal mask and never reads the cache.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

import torch

from modelcall.core import SchedulePlan
from modelcall.core.plan import GROUP_TABLES


@dataclass(slots=True)
class FreshGroup:
    """`num_seqs` whole fresh prompts of `q_len` tokens each, at flat rows [start, start + num_seqs*q_len)."""

    start: int
    num_seqs: int
    q_len: int


@dataclass(slots=True)
class StepBatch:
    input_ids: torch.Tensor          # [1, T]
    positions: torch.Tensor          # [1, T]
    slot_mapping: torch.Tensor       # [T] where each token's new K/V goes
    sample_rows: torch.Tensor | None  # rows of the sampled chunks (plan order); None: every row, in order
    num_sampled: int
    num_paged: int                   # paged-group tokens: flat rows [0, num_paged)
    paged_token_seq: torch.Tensor | None = None  # [num_paged] row of paged_slots per token
    paged_token_pos: torch.Tensor | None = None  # [num_paged] absolute position per token
    paged_slots: torch.Tensor | None = None      # [num_paged_seqs, max_ctx] slot of every context position
    paged_ctx_lens: list[int] = field(default_factory=list)
    paged_q_lens: list[int] = field(default_factory=list)
    fresh: list[FreshGroup] = field(default_factory=list)
    # Prompt logprobs: flat rows whose logits score the next prompt token (`prompt_targets`), and per
    # chunk asking, (chunk index in plan order, number of those rows, top alternatives wanted).
    prompt_rows: torch.Tensor | None = None
    prompt_targets: list[int] = field(default_factory=list)
    prompt_spans: list[tuple[int, int, int]] = field(default_factory=list)
    # Pooling requests (core/pooling.py): (chunk index in plan order, first flat row, rows) whose final hidden
    # states the runner hands back (`StepOutput.pooled`).
    pool_spans: list[tuple[int, int, int]] = field(default_factory=list)
    kv: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # per layer [slots, Hkv, D]
    # KV groups 1.. (models mixing full and sliding layers, core.kv_groups): each group's own slot_mapping
    # and paged_slots, from its own block tables; group 0 uses the two fields above.
    group_slot_mapping: list[torch.Tensor] = field(default_factory=list)
    group_paged_slots: list[torch.Tensor | None] = field(default_factory=list)
    scratch: dict = field(default_factory=dict)  # per-step tensors shared by every layer, built lazily
    # Each plan chunk's last flat row (a decode step's: chunk i is row i), and the step's LoRA rows by adapter
    # (lora_delta.step_groups; None: no row runs on an adapter, the fast decode paths may be taken).
    last_rows: list[int] | None = None
    lora: Any = None


def build_step(plan: SchedulePlan, block_size: int, device: torch.device, num_groups: int = 1,
               state: DecodeState | None = None) -> StepBatch:
    """Flatten `plan` into one batch (pure bookkeeping: no model work). With `num_groups` > 1 each request's
    tables of groups 1.. are read from `request.extra[GROUP_TABLES]`. With `state` (kept by the runner between
    steps), a decode step of the same requests as the last one is updated from the last, not built anew."""
    if state is not None:
        batch = state.decode_step(plan, block_size, device, num_groups)
        if batch is not None:
            return batch
    batch = _build(plan, block_size, device, num_groups)
    if state is not None:
        state.remember(plan, batch, block_size, device, num_groups)
    return batch


def _build(plan: SchedulePlan, block_size: int, device: torch.device, num_groups: int) -> StepBatch:
    """The batch built from scratch: order the chunks, flatten their tokens, then the KV slots each reads
    and writes (paged group, KV groups 1..) and the fresh groups' spans."""
    chunks = plan.chunks
    paged, fresh_by_len = _split(chunks)
    order = paged + [i for q in sorted(fresh_by_len) for i in fresh_by_len[q]]
    rows = _flatten(chunks, order)
    table = _padded(rows.tables)
    pos_t = _longs(rows.pos)
    seq_t = _longs(rows.seq)
    sampled = _sampled_rows(plan, rows.last_row)
    n = len(rows.ids)
    batch = StepBatch(
        input_ids=_longs(rows.ids).view(1, -1).to(device),
        positions=pos_t.view(1, -1).to(device),
        slot_mapping=_new_slots(table, seq_t, pos_t, block_size).to(device),
        sample_rows=None if len(sampled) == n and sampled == list(range(n)) else _longs(sampled).to(device),
        num_sampled=len(sampled),
        num_paged=0,
    )
    batch.last_rows = rows.last_row
    if rows.prompt_rows:
        batch.prompt_rows = _longs(rows.prompt_rows).to(device)
        batch.prompt_targets = rows.prompt_targets
        batch.prompt_spans = rows.prompt_spans
    batch.pool_spans = rows.pool_spans
    ar = _add_paged(batch, chunks, paged, table, seq_t, pos_t, block_size, device) if paged else None
    for g in range(1, num_groups):
        gtable = _padded([chunks[i].request.extra[GROUP_TABLES][g - 1] for i in order])
        batch.group_slot_mapping.append(_new_slots(gtable, seq_t, pos_t, block_size).to(device))
        batch.group_paged_slots.append(
            _context_slots(gtable[:len(paged)], ar, block_size).to(device) if ar is not None else None)
    row = batch.num_paged
    for q in sorted(fresh_by_len):
        k = len(fresh_by_len[q])
        batch.fresh.append(FreshGroup(row, k, q))
        row += k * q
    return batch


def _split(chunks: list[Any]) -> tuple[list[int], dict[int, list[int]]]:
    """Chunk indices of the paged group (read earlier K/V), and of the fresh prompts by their length."""
    paged: list[int] = []
    fresh_by_len: dict[int, list[int]] = {}
    for i, c in enumerate(chunks):
        if c.fork_of is not None:
            continue  # computes nothing: samples from the row of the chunk it was forked from
        if c.request.num_computed_tokens == 0 and c.num_new_tokens > 1:
            fresh_by_len.setdefault(c.num_new_tokens, []).append(i)
        else:
            paged.append(i)
    return paged, fresh_by_len


@dataclass(slots=True)
class FlatRows:
    """The step's tokens in flat-row order, as Python lists (one tensor each is made from them)."""

    ids: list[int] = field(default_factory=list)
    pos: list[int] = field(default_factory=list)
    seq: list[int] = field(default_factory=list)        # the flat row's request, in `order`
    tables: list[list[int]] = field(default_factory=list)
    last_row: list[int] = field(default_factory=list)   # per chunk in plan order: its last flat row
    prompt_rows: list[int] = field(default_factory=list)
    prompt_targets: list[int] = field(default_factory=list)
    prompt_spans: list[tuple[int, int, int]] = field(default_factory=list)
    pool_spans: list[tuple[int, int, int]] = field(default_factory=list)


def _flatten(chunks: list[Any], order: list[int]) -> FlatRows:
    rows = FlatRows(last_row=[0] * len(chunks))
    ids, pos, seq, tables, last_row = rows.ids, rows.pos, rows.seq, rows.tables, rows.last_row
    for k, i in enumerate(order):
        c = chunks[i]
        req = c.request
        s = req.num_computed_tokens
        e = s + c.num_new_tokens
        if c.draft:   # the last known token, then the proposed ones (speculative decoding)
            ids.extend(req.all_token_ids[s:e - len(c.draft)])
            ids.extend(c.draft)
        else:
            ids.extend(req.all_token_ids[s:e])
        pos.extend(range(s, e))
        seq.extend([k] * c.num_new_tokens)
        tables.append(req.block_table)
        last_row[i] = len(ids) - 1
        if req.params.prompt_logprobs is not None:
            _score_prompt(rows, i, req, s, e, len(ids) - c.num_new_tokens)
        if req.pooling is not None:
            _pool_rows(rows, i, req, s, e, len(ids) - c.num_new_tokens)
    if len(order) < len(chunks):
        index = {id(c.request): i for i, c in enumerate(chunks)}
        for i, c in enumerate(chunks):
            if c.fork_of is not None:
                last_row[i] = last_row[index[id(c.fork_of)]]
    return rows


def _score_prompt(rows: FlatRows, i: int, req: Any, s: int, e: int, first_row: int) -> None:
    """Chunk i (positions s..e at flat rows from `first_row`) asks for prompt logprobs: its rows that score
    a prompt token. NOTE: row p scores prompt token p + 1; rows already scored (before a preemption) are
    skipped."""
    lo, hi = max(s, len(req.prompt_logprobs)), min(e, req.num_prompt_tokens - 1)
    if lo < hi:
        first = first_row + lo - s
        rows.prompt_rows.extend(range(first, first + hi - lo))
        rows.prompt_targets.extend(req.all_token_ids[lo + 1:hi + 1])
        rows.prompt_spans.append((i, hi - lo, req.params.prompt_logprobs))


def _pool_rows(rows: FlatRows, i: int, req: Any, s: int, e: int, first_row: int) -> None:
    """Chunk i of a pooling request (positions s..e at flat rows from `first_row`): every row when its pooler
    reads every token, else the prompt's last row once the chunk reaches it."""
    if req.pooling.every_token:
        rows.pool_spans.append((i, first_row, e - s))
    elif e == req.num_prompt_tokens:
        rows.pool_spans.append((i, first_row + e - s - 1, 1))


def _sampled_rows(plan: SchedulePlan, last_row: list[int]) -> list[int]:
    """The flat rows whose logits are sampled, in plan order."""
    if plan.num_draft_tokens:   # a chunk with a draft is verified at its last 1 + len(draft) rows
        return [r for i, c in enumerate(plan.chunks) if c.sample
                for r in range(last_row[i] - len(c.draft or ()), last_row[i] + 1)]
    return [last_row[i] for i, c in enumerate(plan.chunks) if c.sample]


def _add_paged(batch: StepBatch, chunks: list[Any], paged: list[int], table: torch.Tensor, seq_t: torch.Tensor,
               pos_t: torch.Tensor, block_size: int, device: torch.device) -> torch.Tensor:
    """The paged group's view (its tokens are flat rows [0, num_paged)); returns the context positions
    0..max_ctx-1 its slots cover, for the other KV groups' slots."""
    q_lens = [chunks[i].num_new_tokens for i in paged]
    ctx = [chunks[i].request.num_computed_tokens + q for i, q in zip(paged, q_lens)]
    ar = torch.arange(max(ctx))
    n_tok = sum(q_lens)
    batch.num_paged = n_tok
    batch.paged_token_seq = seq_t[:n_tok].to(device)
    batch.paged_token_pos = pos_t[:n_tok].to(device)
    batch.paged_slots = _context_slots(table[:len(paged)], ar, block_size).to(device)
    batch.paged_ctx_lens = ctx
    batch.paged_q_lens = q_lens
    return ar


def _padded(tables: list[list[int]]) -> torch.Tensor:
    """[S, widest] block tables, short ones padded with block 0 (never read: past their context)."""
    width = max(len(t) for t in tables)
    return _longs([b for t in tables for b in t + [0] * (width - len(t))]).view(len(tables), width)


def _new_slots(table: torch.Tensor, seq_t: torch.Tensor, pos_t: torch.Tensor, block_size: int) -> torch.Tensor:
    """[T] the slot each flat row's new K/V is written to."""
    return table[seq_t, pos_t // block_size] * block_size + pos_t % block_size


def _longs(values: list[int]) -> torch.Tensor:
    """An int64 CPU tensor of `values`. NOTE: through array('q'): torch.tensor of a Python list converts
    element by element (32 x 3 ids: ~15-29 us against ~2.5 us); the tensor keeps the array alive."""
    if not values:
        return torch.empty(0, dtype=torch.long)
    return torch.frombuffer(array("q", values), dtype=torch.long)


def _context_slots(table: torch.Tensor, ar: torch.Tensor, block_size: int) -> torch.Tensor:
    """[S, max_ctx] slot of every context position of each paged request.

    NOTE: clamped: a block out of its layers' window is RELEASED (-1) in the table; its positions are
    masked out (torch path) or never read (C kernel), but the gather needs a valid slot.
    """
    return (table[:, ar // block_size] * block_size + ar % block_size).clamp_(min=0)


class DecodeState:
    """What a decode step needs from the last one, kept so that the next decode step of the same requests is
    an update: the context slots of every request as a persistent [S, capacity] tensor, changed only where
    a block table changed (a block appended every `block_size` tokens), and each request's last table.

        slots row s:  [ t0*bs .. t0*bs+bs-1 | t1*bs .. | ... | p % bs past the table ]   (clamped at 0)

    which is what `_build` computes for positions < max_ctx, so `paged_slots` is the first max_ctx columns.
    Anything else (a new or finished request, a chunk of more than one token, drafts, forks, prompt logprobs,
    several KV groups, a table rewritten other than by appending, CUDA) is built anew and remembered.
    """

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.tables: list[list[int]] = []
        self.computed: list[int] = []         # num_computed_tokens of each at the last step
        self.slots: torch.Tensor | None = None
        self.seq: torch.Tensor | None = None  # arange(S)
        self.offsets: torch.Tensor | None = None   # arange(block_size)

    def remember(self, plan: SchedulePlan, batch: StepBatch, block_size: int, device: torch.device,
                 num_groups: int) -> None:
        self.requests = []
        if not self._decode_plan(plan, device, num_groups) or batch.paged_slots is None:
            return
        reqs = [c.request for c in plan.chunks]
        self.tables = [list(r.block_table) for r in reqs]
        self.computed = [r.num_computed_tokens for r in reqs]
        cap_blocks = -(-max(64, 2 * batch.paged_slots.shape[1]) // block_size)
        table = _longs([b for t in self.tables for b in (t + [0] * cap_blocks)[:cap_blocks]]).view(-1, cap_blocks)
        self.slots = _context_slots(table, torch.arange(cap_blocks * block_size), block_size)
        self.seq = torch.arange(len(reqs))
        self.offsets = torch.arange(block_size)
        self.requests = reqs

    @staticmethod
    def _decode_plan(plan: SchedulePlan, device: torch.device, num_groups: int) -> bool:
        return (device.type == "cpu" and num_groups == 1 and not plan.num_draft_tokens and bool(plan.chunks)
                and all(c.num_new_tokens == 1 and c.sample and c.fork_of is None and not c.draft
                        and c.request.params.prompt_logprobs is None for c in plan.chunks))

    def _fill(self, s: int, first: int, table: list[int], block_size: int) -> None:
        """Row s's slots of table blocks first.. (the part inside the capacity)."""
        row = self.slots[s]
        for j, b in enumerate(table[first:self.slots.shape[1] // block_size], first):   # one block, mostly
            part = row[j * block_size:(j + 1) * block_size]
            if b >= 0:
                torch.add(self.offsets, b * block_size, out=part)
            else:
                part.zero_()   # released (out of the window): clamped as _context_slots does

    def decode_step(self, plan: SchedulePlan, block_size: int, device: torch.device, num_groups: int) -> StepBatch | None:
        chunks = plan.chunks
        if len(chunks) != len(self.requests) or plan.num_draft_tokens or num_groups != 1 or device.type != "cpu":
            return None
        computed = self.computed
        ids: list[int] = []
        pos: list[int] = []
        new: list[int] = []
        # NOTE: a request's params are frozen: prompt_logprobs was checked when the batch was remembered
        for s, (c, known) in enumerate(zip(chunks, self.requests)):
            req = c.request
            p = req.num_computed_tokens
            if req is not known or p != computed[s] + 1 or c.num_new_tokens != 1 or not c.sample or c.draft \
                    or c.fork_of is not None:
                return None
            slot = self.slot_of(s, req.block_table, p, block_size)
            if slot is None:
                return None
            ids.append(req.all_token_ids[p])
            pos.append(p)
            new.append(slot)
            computed[s] = p
        return self._batch(ids, pos, new)

    def advance(self, tokens: list[int], block_size: int) -> StepBatch | None:
        """The step after the last decode step, its requests fed `tokens` (what it sampled) without being told them:
        a decode burst (core/burst.py), whose tokens join the requests only once it is over. Each position one
        further, its slot from the request's table (grown for the burst beforehand). None: build anew."""
        if not self.requests or len(tokens) != len(self.requests):
            return None
        pos: list[int] = []
        new: list[int] = []
        for s, req in enumerate(self.requests):
            p = self.computed[s] + 1
            slot = self.slot_of(s, req.block_table, p, block_size)
            if slot is None:
                self.requests = []   # some rows advanced, others not: forget them all
                return None
            pos.append(p)
            new.append(slot)
            self.computed[s] = p
        return self._batch(list(tokens), pos, new)

    def slot_of(self, s: int, table: list[int], p: int, block_size: int) -> int | None:
        """Row s's slot of position p, its slots brought up to `table` (None: the table was rewritten or is short)."""
        old = self.tables[s]
        if table != old:
            if len(table) < len(old) or table[:len(old)] != old:
                return None   # rewritten (a window released blocks, copy on write): built anew
            self._fill(s, len(old), table, block_size)
            self.tables[s] = list(table)
        if p // block_size >= len(table):
            return None
        return table[p // block_size] * block_size + p % block_size

    def _batch(self, ids: list[int], pos: list[int], new: list[int]) -> StepBatch | None:
        """The decode batch of one token a request at positions `pos`, K/V into slots `new`."""
        n, slots = len(ids), self.slots
        max_ctx = max(pos) + 1
        if max_ctx > slots.shape[1]:
            self.requests = []
            return None
        rows = _longs(ids + pos + new)
        batch = StepBatch(input_ids=rows[:n].view(1, n), positions=rows[n:2 * n].view(1, n), slot_mapping=rows[2 * n:],
                          sample_rows=None, num_sampled=n, num_paged=n)
        batch.paged_token_seq = self.seq
        batch.paged_token_pos = rows[n:2 * n]
        batch.paged_slots = slots[:, :max_ctx].contiguous()
        batch.paged_ctx_lens = [p + 1 for p in pos]
        batch.paged_q_lens = [1] * n
        batch.last_rows = list(range(n))   # one row a request, in plan order (as _build's would be)
        return batch
