"""Decode through bucketed static batches (plugins/runner/cuda_graphs.py), the path CUDA graphs capture, run here
eagerly (runner cuda_graphs "eager"): the same static buffers, padding rows and dummy KV block as a captured step.

Greedy text through the Kernel equals the normal path's with batches that pad (5 concurrent requests over
buckets 2, 4, 8: steps of 5, 4, 3... decodes run in buckets 8 and 4), through the C kernel's host metadata and
through the Triton kernel in its CPU interpreter reading only the static device buffers (what a graph replays).
Capture itself needs CUDA: tests/test_gpu.py.
"""
from __future__ import annotations

import random

import anyio
import pytest
import torch

from modelcall.core import ConfigError, Request, SamplingParams, ScheduledChunk, SchedulePlan
from modelcall.plugins.runner import cuda_attention, cuda_graphs

pytestmark = pytest.mark.anyio

_rng = random.Random(5)
PROMPTS = [[_rng.randrange(10, 2000) for _ in range(n)] for n in (3, 9, 17, 30, 6)]
MAX_TOKENS = [4, 9, 12, 7, 10]     # requests finish at different steps: the batch shrinks through the buckets


async def _greedy(make_kernel, model_dir: str, runner_cfg: dict) -> tuple[list[list[int]], object]:
    async with make_kernel(model=model_dir, dtype="float32", block_size=4, max_num_seqs=8,
                           plugin_config={"runner": runner_cfg}) as kernel:
        out: dict[int, list[int]] = {}

        async def one(i: int) -> None:
            done = await kernel.complete(prompt_token_ids=PROMPTS[i], max_tokens=MAX_TOKENS[i], temperature=0,
                                         ignore_eos=True)
            out[i] = done.token_ids

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for i in range(len(PROMPTS)):
                    tg.start_soon(one, i)
        return [out[i] for i in range(len(PROMPTS))], kernel.runner


@pytest.mark.parametrize("attention", ["cpu", "triton"])
async def test_static_decode_batches_give_the_same_greedy_text(demo_model_dir, make_kernel, monkeypatch, attention):
    if attention == "triton" and not cuda_attention.interpreting():  # triton itself is in the test extra
        pytest.skip("needs triton with TRITON_INTERPRET=1")
    want, _ = await _greedy(make_kernel, demo_model_dir, {})
    used: list[tuple[int, int]] = []
    real = cuda_graphs.DecodeGraphs.logits

    def spy(self, plan):
        logits = real(self, plan)
        used.append((len(plan.chunks), logits.shape[0]))
        return logits

    monkeypatch.setattr(cuda_graphs.DecodeGraphs, "logits", spy)
    cfg = {"cuda_graphs": "eager", "graph_buckets": [2, 4, 8]}
    if attention == "triton":
        cfg["attention"] = "triton"
    got, runner = await _greedy(make_kernel, demo_model_dir, cfg)
    assert got == want
    assert runner.graphs is not None and runner.graphs.mode == "eager"
    sizes = {n for n, _ in used}
    assert all(rows == n for n, rows in used), "logits of padding rows are dropped"
    assert {3, 5} & sizes, f"some decode steps padded to a bucket (sizes seen {sorted(sizes)})"


def _decode_plan(tables: list[list[int]], positions: list[int]) -> SchedulePlan:
    chunks = []
    for i, (t, p) in enumerate(zip(tables, positions)):
        req = Request(f"r{i}", list(range(10, 10 + p)), SamplingParams(temperature=0), max_tokens=8)
        req.num_computed_tokens = p
        req.all_token_ids.append(77 + i)     # the token this step decodes
        req.block_table = t
        chunks.append(ScheduledChunk(req, 1, True))
    return SchedulePlan(chunks=chunks)


def test_fill_maps_padding_rows_to_the_dummy_block():
    batch = cuda_graphs.StaticDecodeBatch(4, max_blocks=5, block_size=4, dummy_block=9, device=torch.device("cpu"))
    batch.fill(_decode_plan([[3, 1], [7]], [5, 2]))
    ids, pos, slots, ctx = batch.rows.tolist()
    assert ids == [77, 78, 0, 0] and pos == [5, 2, 0, 0] and ctx == [6, 3, 1, 1]
    assert slots == [1 * 4 + 1, 7 * 4 + 2, 36, 36]            # padding writes only the dummy block's first slot
    assert batch.tables.tolist() == [[3, 1, 9, 9, 9], [7, 9, 9, 9, 9]] + [[9] * 5] * 2
    assert batch.ctx.tolist() == ctx
    # a smaller step into the same buffers leaves nothing of the previous one behind
    batch.fill(_decode_plan([[2]], [0]))
    assert batch.rows.tolist() == [[77, 0, 0, 0], [0, 0, 0, 0], [8, 36, 36, 36], [1, 1, 1, 1]]


def test_supports_only_plain_decode_steps_that_fit():
    graphs = cuda_graphs.DecodeGraphs("eager", (1, 2), 3, 4, 9, torch.device("cpu"), None, [], {})
    assert graphs.supports(_decode_plan([[1], [2]], [1, 3]), 1)
    assert not graphs.supports(_decode_plan([[1], [2], [3]], [1, 1, 1]), 1)           # past the largest bucket
    assert not graphs.supports(_decode_plan([[1, 2, 3, 4]], [1]), 1)                  # table wider than the buffers
    assert not graphs.supports(_decode_plan([[1]], [1]), 2)                           # two KV groups
    prefill = _decode_plan([[1]], [0])
    prefill.chunks[0].request.num_computed_tokens = 0
    prefill.chunks[0] = ScheduledChunk(prefill.chunks[0].request, 2, True)
    assert not graphs.supports(prefill, 1)


def test_buckets_and_modes():
    assert cuda_graphs.buckets_for(256) == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert cuda_graphs.buckets_for(48) == (1, 2, 4, 8, 16, 32, 48)
    assert cuda_graphs.buckets_for(48, [8, 2, 8]) == (2, 8)
    cpu = torch.device("cpu")
    assert cuda_graphs.mode_of(None, cpu) is None and cuda_graphs.mode_of(False, cpu) is None
    assert cuda_graphs.mode_of("eager", cpu) == "eager"
    with pytest.raises(ConfigError, match="need a CUDA device"):
        cuda_graphs.mode_of(True, cpu)
    with pytest.raises(ConfigError, match="true, false"):
        cuda_graphs.mode_of("sometimes", cpu)
