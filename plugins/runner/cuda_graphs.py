"""CUDA graphs for decode steps: static buffers per bucketed batch size, captured once, replayed every step.

Why: a decode step of a 1B model on a big GPU is a few hundred small kernels whose launch cost (Python,
transformers' module calls, the CUDA driver) can exceed their run time. A graph replays them all in one
launch. A graph is fixed in shapes and addresses, so:

    bucket B (1, 2, 4, 8, ... up to max_num_seqs)      a step of n decodes runs in the smallest B >= n
    static buffers of B rows: token ids, positions, new-K/V slots, block tables [B, max_blocks], context
    lengths; padding rows n..B-1 decode token 0 at position 0 into a DUMMY slot (one extra KV block the
    block manager never hands out), read only that block, and their logits are dropped
    one memory pool shared by every bucket's graph

Each step fills the host side (pinned on CUDA) and copies it to the device buffers with non-blocking copies,
then replays; the logits come back as a view of the bucket's static output (valid until the next step).

The attention of a captured step must read only device tensors (no per-step host metadata): it is the
Triton kernel (cuda_attention) over the static tables and lengths. Capture needs CUDA; `mode="eager"` runs the
very same static buffers, padding and dummy slot without a graph (on CPU with Triton's interpreter or the C
kernel), which is how the tests check this path here.
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from modelcall.core import ConfigError, SchedulePlan
from modelcall.plugins.runner.batch import StepBatch, _context_slots

log = logging.getLogger("modelcall.runner")


def buckets_for(max_num_seqs: int, configured: Any = None) -> tuple[int, ...]:
    """Batch sizes to capture: `configured` (a list) or powers of two up to max_num_seqs (and it)."""
    if configured:
        sizes = sorted({int(b) for b in configured})
        if sizes[0] < 1:
            raise ConfigError(f"runner graph_buckets {configured!r}: sizes must be >= 1")
        return tuple(sizes)
    sizes, b = [], 1
    while b < max_num_seqs:
        sizes.append(b)
        b *= 2
    sizes.append(max_num_seqs)
    return tuple(sizes)


class StaticDecodeBatch:
    """Device buffers of one bucket of `size` decode rows, their host staging, and the StepBatch over them."""

    def __init__(self, size: int, max_blocks: int, block_size: int, dummy_block: int, device: torch.device) -> None:
        self.size, self.max_blocks, self.block_size, self.dummy_block = size, max_blocks, block_size, dummy_block
        self.device = device
        pin = device.type == "cuda"
        i32, i64 = torch.int32, torch.long
        # host staging: [ids | positions | slots | ctx] as one int64 row block, tables apart (int32)
        self.host_rows = torch.zeros(4, size, dtype=i64, pin_memory=pin)
        self.host_tables = torch.zeros(size, max_blocks, dtype=i32, pin_memory=pin)
        self.rows = torch.zeros(4, size, dtype=i64, device=device)
        self.tables = torch.full((size, max_blocks), dummy_block, dtype=i32, device=device)
        self.ctx = torch.ones(size, dtype=i32, device=device)
        self.q_start = torch.arange(size, dtype=i32, device=device)
        self.q_len = torch.ones(size, dtype=i32, device=device)
        self.num_rows = 0
        self.logits: torch.Tensor | None = None     # the captured graph's output

    def fill(self, plan: SchedulePlan) -> None:
        """Write `plan`'s decode rows (plan order) and padding into the device buffers, host to device once."""
        bs, dummy = self.block_size, self.dummy_block
        chunks = plan.chunks
        n = len(chunks)
        ids, pos, slots, ctx, tables = [], [], [], [], []
        for c in chunks:
            req = c.request
            p = req.num_computed_tokens
            t = req.block_table
            ids.append(req.all_token_ids[p])
            pos.append(p)
            slots.append(t[p // bs] * bs + p % bs)
            ctx.append(p + 1)
            tables.append(t + [dummy] * (self.max_blocks - len(t)))
        pad = self.size - n
        ids += [0] * pad
        pos += [0] * pad
        slots += [dummy * bs] * pad
        ctx += [1] * pad
        tables += [[dummy] * self.max_blocks] * pad
        self.host_rows.copy_(torch.tensor([ids, pos, slots, ctx], dtype=torch.long))
        self.host_tables.copy_(torch.tensor(tables, dtype=torch.int32))
        self.rows.copy_(self.host_rows, non_blocking=True)
        self.tables.copy_(self.host_tables, non_blocking=True)
        self.ctx.copy_(self.rows[3])
        self.num_rows = n

    def step(self, kv: list, scratch: dict) -> StepBatch:
        """The StepBatch the model runs on. With the Triton backend the attention reads only the static device
        buffers (capturable); without it (eager on CPU) it gets the host-side metadata the C kernel and the
        torch path read, built from the same buffers."""
        b = self.size
        step = StepBatch(input_ids=self.rows[0].view(1, b), positions=self.rows[1].view(1, b),
                         slot_mapping=self.rows[2], sample_rows=None, num_sampled=b, num_paged=b,
                         paged_q_lens=[1] * b)
        step.kv = kv
        step.scratch.update(scratch)
        if scratch.get("attention_backend") == "triton":
            step.scratch["static_meta"] = (self.tables, self.ctx, self.q_start, self.q_len, 1)
        else:
            ctx = self.host_rows[3].tolist()
            step.paged_ctx_lens = ctx
            ar = torch.arange(max(ctx))
            nb = -(-max(ctx) // self.block_size)
            step.paged_slots = _context_slots(self.host_tables[:, :nb].long(), ar, self.block_size).to(self.device)
            step.paged_token_seq = torch.arange(b, device=self.device)
            step.paged_token_pos = self.rows[1]
        return step


class DecodeGraphs:
    """Decode steps through bucketed static batches: captured CUDA graphs (`mode="cuda"`) or the same buffers
    run eagerly (`mode="eager"`). `forward(step)` is the runner's decoder + head on a StepBatch."""

    def __init__(self, mode: str, buckets: tuple[int, ...], max_blocks: int, block_size: int, dummy_block: int,
                 device: torch.device, forward: Any, kv: list, scratch: dict) -> None:
        if mode not in ("cuda", "eager"):
            raise ConfigError(f"runner cuda_graphs mode {mode!r}: cuda or eager")
        if mode == "cuda" and device.type != "cuda":
            raise ConfigError("runner cuda_graphs: CUDA graphs need a CUDA device (eager runs the same path)")
        if mode == "cuda" and scratch.get("attention_backend") != "triton":
            raise ConfigError("runner cuda_graphs: a captured step needs the Triton attention (runner attention "
                              "auto or triton, and triton installed)")
        self.mode, self.buckets, self.max_blocks, self.block_size = mode, buckets, max_blocks, block_size
        self.device, self.forward, self.kv, self.scratch = device, forward, kv, scratch
        self.batches = {b: StaticDecodeBatch(b, max_blocks, block_size, dummy_block, device) for b in buckets}
        self.graphs: dict[int, Any] = {}
        self.pool: Any = None
        self.error: str | None = None      # why capture failed (then every step runs eagerly)
        self.replays = 0
        self.static_steps = 0              # decode steps run through the static batches (replayed or eager)

    def supports(self, plan: SchedulePlan, num_groups: int) -> bool:
        """A plain decode step that fits the largest bucket and the static tables."""
        chunks = plan.chunks
        if not chunks or len(chunks) > self.buckets[-1] or num_groups != 1 or plan.num_draft_tokens:
            return False
        for c in chunks:
            req = c.request
            if (c.num_new_tokens != 1 or not c.sample or c.fork_of is not None or c.draft
                    or req.num_computed_tokens < req.num_prompt_tokens
                    or len(req.block_table) > self.max_blocks):
                return False
        return True

    def logits(self, plan: SchedulePlan) -> torch.Tensor:
        """Logits [n, vocab] of a supported decode plan (plan order)."""
        n = len(plan.chunks)
        b = next(size for size in self.buckets if size >= n)
        batch = self.batches[b]
        batch.fill(plan)
        self.static_steps += 1
        if self.mode == "eager" or self.error is not None:
            return self.forward(batch.step(self.kv, self.scratch))[:n]
        graph = self.graphs.get(b)
        if graph is None:
            graph = self._capture(batch)
            if graph is None:
                return self.forward(batch.step(self.kv, self.scratch))[:n]
        graph.replay()
        self.replays += 1
        return batch.logits[:n]

    def _capture(self, batch: StaticDecodeBatch) -> Any:
        """Capture one bucket (after warm-up runs on a side stream, as torch.cuda.graphs asks); a failure is
        logged, kept in `error`, and graphs are off from then on (eager steps, same results)."""
        try:
            step = batch.step(self.kv, self.scratch)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self.forward(step)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                batch.logits = self.forward(step)
            self.pool = graph.pool()
            self.graphs[batch.size] = graph
            return graph
        except Exception as e:  # noqa: BLE001 - any capture failure means eager decode, not a failed step
            self.error = f"{type(e).__name__}: {e}"
            log.warning("CUDA graph capture failed for bucket %d, decoding eagerly: %s", batch.size, self.error)
            return None


def mode_of(value: Any, device: torch.device) -> str | None:
    """plugin_config runner `cuda_graphs`: false/absent (off, the default until measured on a GPU), true
    ("cuda": capture, CUDA only) or "eager" (the same static buffers without capture: tests, CPU)."""
    if value in (None, False, "off"):
        return None
    if value in (True, "on", "cuda"):
        if device.type != "cuda":
            raise ConfigError("runner cuda_graphs: CUDA graphs need a CUDA device (\"eager\" runs the same path)")
        return "cuda"
    if value == "eager":
        return "eager"
    raise ConfigError(f"runner cuda_graphs {value!r}: give true, false or \"eager\"")


def for_runner(runner: Any, num_blocks: int, block_size: int) -> DecodeGraphs:
    """The runner's decode graphs over its freshly allocated cache, whose block `num_blocks` is the dummy."""
    cfg, max_num_seqs = runner.graph_cfg
    scratch: dict = {"layer_windows": runner.spec.layer_windows}
    if runner.attention_backend:
        scratch.update(attention_backend=runner.attention_backend, block_size=block_size)
    return DecodeGraphs(runner.graph_mode, buckets_for(max_num_seqs, cfg.get("graph_buckets")),
                        -(-runner.spec.max_model_len // block_size), block_size, num_blocks,
                        runner.placement.device, lambda step: runner._head(runner._forward(step)), runner.kv, scratch)
