"""Speculative decoding changes nothing in what the model says (greedy) and keeps the target distribution
(sampled): drafts verified in one forward, rejected K/V rolled back, under continuous batching, prefix
caching, preemption and aborts.

The random demo model never repeats itself, so prompt lookup finds little to accept there. To drive the
verification path with drafts that are partly right, `OracleProposer` (a test plugin) proposes the
reference continuation with every third draft position wrong; suffix decoding gets real hits from a
retried request (the workload of an agent that retries).
"""
from __future__ import annotations

import collections
import math
import random

import anyio
import pytest
from greedy_refs import greedy_continuations, prompts_with_a_shared_prefix
import torch
from kv_invariants import check_whole
from test_overlap import ForwardProbe

from modelcall.core import ConfigError, KernelConfig, hookimpl
from modelcall.core.plan import ScheduledChunk
from modelcall.core.request import Request
from modelcall.core.params import SamplingParams
from modelcall.core.speculative import Speculator, parse_config
from modelcall.events import Preempted, StepDone
from modelcall.plugins.sampler.sampler import TorchSampler
from modelcall.plugins.speculative.ngram import NgramProposer
from modelcall.plugins.speculative.suffix import SuffixProposer

pytestmark = pytest.mark.anyio

MAX_TOKENS = 16
PROMPTS = prompts_with_a_shared_prefix(seed=99, prefix=30, shortest_own=2)


@pytest.fixture(scope="module")
def references(demo_model_dir) -> list[list[int]]:
    return greedy_continuations(demo_model_dir, PROMPTS, MAX_TOKENS)


class OracleProposer:
    """Proposes the reference continuation, wrong at every third output position (a rejection there)."""

    modelcall_plugin_name = "oracle_proposer"

    def __init__(self, references: dict[tuple[int, ...], list[int]]) -> None:
        self.references = references

    @hookimpl
    def provide_proposer(self, config, spec_config):
        return self

    def propose(self, request: Request, k: int) -> list[int]:
        ref = self.references[tuple(request.prompt_token_ids)]
        at = request.num_output_tokens
        return [t if (at + j) % 3 else (t + 1) % 2048 for j, t in enumerate(ref[at:at + k])]

    def finished(self, request: Request) -> None:
        pass


async def _run_all(kernel, prompts: list[list[int]], max_tokens: int = MAX_TOKENS, stagger: bool = True,
                   **params) -> list[list[int]]:
    """Greedy outputs of `prompts` (arrivals staggered unless `stagger` is False; odd ones get `params`)."""
    results: dict[int, list[int]] = {}

    async def one(i: int) -> None:
        if stagger:
            await anyio.sleep(0.01 * (i % 3))
        done = await kernel.complete(prompt_token_ids=prompts[i], max_tokens=max_tokens, temperature=0,
                                     ignore_eos=True, **(params if i % 2 else {}))
        results[i] = done.token_ids

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)
    return [results[i] for i in range(len(prompts))]


@pytest.mark.parametrize("block_size,num_kv_blocks", [(16, 7), (4, 60)])
async def test_greedy_parity_with_drafts_mixed_batches_and_preemption(
        make_kernel, events, references, demo_model_dir, block_size, num_kv_blocks):
    # Odd requests ask for logprobs: never speculated, in the same steps as the speculating ones.
    oracle = OracleProposer({tuple(p): r for p, r in zip(PROMPTS, references)})
    async with make_kernel(plugins=[oracle], model=demo_model_dir, block_size=block_size,
                           num_kv_blocks=num_kv_blocks, max_num_batched_tokens=24,
                           speculative_config={"method": "ngram", "num_speculative_tokens": 4}) as kernel:
        got = await _run_all(kernel, PROMPTS, logprobs=1)
        check_whole(kernel.kv)
        spec = kernel.speculator
    assert got == references
    assert spec.num_accepted_tokens > 0 and spec.num_draft_tokens > spec.num_accepted_tokens
    assert spec.accepted_by_position[0] >= spec.accepted_by_position[1] > 0
    if num_kv_blocks == 7:   # 7 blocks of 16 hold barely two of these requests
        assert any(isinstance(e, Preempted) for e in events.events)


SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 9}},
          "required": ["city", "days"], "additionalProperties": False}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA, "strict": True}}


async def test_grammar_constrained_requests_keep_their_output_beside_speculating_ones(make_kernel, events, references,
                                                                                      demo_model_dir):
    """A real grammar (llguidance json_schema) in the same steps as drafted, verified and rolled-back
    requests, under preemption: the constrained output equals the one speculation off gives, and is
    valid; the others equal transformers."""
    import json

    import jsonschema

    async def constrained(kernel, i: int) -> list[int]:
        done = await kernel.complete(prompt_token_ids=PROMPTS[i], max_tokens=40, temperature=0,
                                     response_format=JSON_FORMAT)
        assert done.finish_reason == "stop", done
        jsonschema.validate(json.loads(done.text), SCHEMA)
        return list(done.token_ids)

    async with make_kernel(model=demo_model_dir, block_size=16, num_kv_blocks=64, max_num_batched_tokens=24) as k:
        alone = [await constrained(k, i) for i in (0, 3)]
    seen_before = len(events.events)
    oracle = OracleProposer({tuple(p): r for p, r in zip(PROMPTS, references)})
    async with make_kernel(plugins=[oracle], model=demo_model_dir, block_size=16, num_kv_blocks=7,
                           max_num_batched_tokens=24,
                           speculative_config={"method": "ngram", "num_speculative_tokens": 4}) as kernel:
        got: dict[str, list] = {}

        async def grammar_side() -> None:
            got["constrained"] = [await constrained(kernel, i) for i in (0, 3)]

        async def drafting_side() -> None:
            got["plain"] = await _run_all(kernel, PROMPTS)

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                tg.start_soon(drafting_side)
                tg.start_soon(grammar_side)
        check_whole(kernel.kv)
        spec = kernel.speculator
    assert got["plain"] == references
    assert got["constrained"] == alone
    assert spec.num_accepted_tokens > 0 and spec.num_draft_tokens > spec.num_accepted_tokens
    assert any(isinstance(e, Preempted) for e in events.events[seen_before:])  # 7 blocks hold barely two requests


async def test_prompt_lookup_parity_and_suffix_retry_accepts(make_kernel, references, demo_model_dir):
    """A retried request (same prompt again) is proposed its earlier output by suffix decoding: nearly
    every draft is accepted and the text is the same; prompt lookup changes no output either."""
    for method in ("ngram", "suffix"):
        async with make_kernel(model=demo_model_dir, block_size=4, num_kv_blocks=80, max_num_batched_tokens=64,
                               speculative_config={"method": method, "num_speculative_tokens": 5}) as kernel:
            first = await _run_all(kernel, PROMPTS)
            assert first == references
            before = kernel.speculator.num_accepted_tokens
            again = await _run_all(kernel, PROMPTS[:2])   # retries: prefix cache hits and suffix hits
            assert again == references[:2]
            spec = kernel.speculator
            check_whole(kernel.kv)
        if method == "suffix":
            accepted = spec.num_accepted_tokens - before
            assert accepted >= 2 * (MAX_TOKENS - 6), (accepted, spec.num_draft_tokens)


async def test_speculation_under_async_scheduling_keeps_outputs_and_stops(make_kernel, references, demo_model_dir):
    """With async_scheduling, drafts (accepted and rejected, under preemption) give the same greedy text,
    a stop token inside an accepted draft ends the request there, and tokens are published while the next
    forward runs."""
    oracle = OracleProposer({tuple(p): r for p, r in zip(PROMPTS, references)})
    probe = ForwardProbe(patience_s=0.05, until_seen=True)  # lenient: any one token published during a forward will do
    async with make_kernel(plugins=[oracle, probe], model=demo_model_dir, block_size=16, num_kv_blocks=7,
                           max_num_batched_tokens=24, async_scheduling=True,
                           speculative_config={"method": "ngram", "num_speculative_tokens": 4}) as kernel:
        kernel.engine.runner.execute = probe.hold(kernel.runner.execute, hold_s=0)  # busy while a step runs
        got = await _run_all(kernel, PROMPTS, logprobs=1)
        ref = references[1]
        stop = ref[7]
        stopped = await kernel.complete(prompt_token_ids=PROMPTS[1], max_tokens=MAX_TOKENS, temperature=0,
                                        ignore_eos=True, stop_token_ids=[stop])
        check_whole(kernel.kv)
        spec = kernel.speculator
    assert got == references
    assert spec.num_accepted_tokens > 0 and spec.num_draft_tokens > spec.num_accepted_tokens
    assert stopped.finish_reason == "stop" and stopped.token_ids == ref[:ref.index(stop) + 1]
    assert stopped.usage.completion_tokens == len(stopped.token_ids)
    assert any(probe.seen), "no token was published during a forward: async scheduling did not run"


async def test_disable_by_batch_size_keeps_drafts_out_of_larger_batches(make_kernel, references, demo_model_dir):
    oracle = OracleProposer({tuple(p): r for p, r in zip(PROMPTS, references)})
    drafted = {}
    for limit in (1, 2):   # two requests run together from start to end
        async with make_kernel(plugins=[oracle], model=demo_model_dir, speculative_config={
                "method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": limit}) as kernel:
            assert await _run_all(kernel, PROMPTS[:2], stagger=False) == references[:2]
            drafted[limit] = kernel.speculator.num_draft_tokens
    assert drafted[1] == 0 and drafted[2] > 0, drafted


async def test_abort_while_speculating_frees_everything(make_kernel, references, demo_model_dir):
    oracle = OracleProposer({tuple(p): r + [7] * 400 for p, r in zip(PROMPTS, references)})
    async with make_kernel(plugins=[oracle], model=demo_model_dir, block_size=4, num_kv_blocks=120,
                           speculative_config={"method": "ngram", "num_speculative_tokens": 3}) as kernel:
        handle = await kernel.submit(prompt_token_ids=PROMPTS[0], max_tokens=300, temperature=0, ignore_eos=True)
        async with handle:
            with anyio.fail_after(60):
                while kernel.speculator.num_drafts < 3:
                    await anyio.sleep(0.005)
            kernel.abort(handle.request_id)
            done = await handle.result()
        assert done.finish_reason == "abort"
        with anyio.fail_after(10):
            while kernel.scheduler.num_running:
                await anyio.sleep(0.01)
        check_whole(kernel.kv)


def _chunk(params: SamplingParams, draft: list[int]) -> ScheduledChunk:
    req = Request("r", [11, 12, 13], params, max_tokens=100)
    req.all_token_ids.append(14)   # one output token: decoding
    return ScheduledChunk(req, 1 + len(draft), True, draft=draft)


def _by_hand(row: list[float], temperature: float, top_k: int, top_p: float) -> list[float]:
    """The distribution a sampled token must follow, computed here, not by the sampler under test: softmax of
    logits / temperature over the top_k largest, then the most likely tokens until their mass reaches top_p."""
    z = [v / temperature for v in row]
    order = sorted(range(len(z)), key=lambda t: -z[t])[: top_k or len(z)]
    w = {t: math.exp(z[t] - z[order[0]]) for t in order}
    total, mass, kept = sum(w.values()), 0.0, []
    for t in order:
        if kept and mass >= top_p:
            break
        kept.append(t)
        mass += w[t] / total
    norm = sum(w[t] for t in kept)
    return [w[t] / norm if t in kept else 0.0 for t in range(len(z))]


@pytest.mark.parametrize("temperature, top_k, top_p", [(0.8, 5, 1.0), (1.3, 0, 0.8)], ids=["top-k", "top-p"])
def test_sampled_verification_keeps_the_target_distribution(temperature, top_k, top_p) -> None:
    """Chi-square over the first two emitted tokens of many verifications of a fixed draft: the first
    follows row 0's distribution whatever the draft, the second (given the draft was accepted) row 1's."""
    torch.manual_seed(0)
    rows = [[1.0, 0.2, -0.5, 0.7, 0.0, -1.0],
            [0.1, 0.9, 0.3, -0.2, -1.5, 0.4],
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]
    logits = torch.tensor(rows)
    target = [_by_hand(r, temperature, top_k, top_p) for r in rows]
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    sampler = TorchSampler()
    first, second = collections.Counter(), collections.Counter()
    n = 12000
    chunk = _chunk(params, [3, 1])
    for _ in range(n):
        out = sampler.verify(logits, chunk)
        first[out[0]] += 1
        if out[0] == 3:
            second[out[1]] += 1

    def chi2(counts: collections.Counter, p: list[float]) -> float:
        total = sum(counts.values())
        assert all(p[t] > 0 for t in counts), (counts, p)  # nothing outside the kept set is ever drawn
        return sum((counts[t] - total * p[t]) ** 2 / (total * p[t]) for t in range(len(p)) if p[t] > 0)

    assert 0 < sum(p == 0 for p in target[0]) < 6      # each case cuts some tokens of row 0 (top-k 5 cuts one)
    assert chi2(first, target[0]) < 30.0                # at most 5 degrees of freedom: 30 is past p = 2e-5
    assert chi2(second, target[1]) < 30.0
    assert sum(second.values()) > 0.2 * n


def test_greedy_verification_accepts_the_matching_prefix() -> None:
    logits = torch.full((4, 8), -1.0)
    for row, best in enumerate([2, 5, 1, 7]):
        logits[row, best] = 3.0
    sampler = TorchSampler()
    greedy = SamplingParams(temperature=0)
    assert sampler.verify(logits, _chunk(greedy, [2, 5, 1])) == [2, 5, 1, 7]   # all accepted + bonus
    assert sampler.verify(logits, _chunk(greedy, [2, 4, 1])) == [2, 5]        # correction at the mismatch
    assert sampler.verify(logits, _chunk(greedy, [0, 5, 1])) == [2]
    # Several drafted chunks at once, rows back to back: a 2-token draft (rows 0-2), a 1-token one (row 3 + a
    # fifth row whose argmax is 6); a sampled one (temperature 1, top-k 1: its draft must be row 5's argmax).
    both = torch.cat([logits, torch.full((2, 8), -1.0)])
    both[4, 6] = 3.0
    both[5, 3] = 3.0
    both = torch.cat([both, torch.full((1, 8), -1.0)])
    both[6, 0] = 3.0
    chunks = [_chunk(greedy, [2, 5]), _chunk(greedy, [7]), _chunk(SamplingParams(temperature=1.0, top_k=1), [3])]
    assert sampler.verify_many(both, chunks) == [[2, 5, 1], [7, 6], [3, 0]]


def test_proposers_look_up_earlier_text() -> None:
    req = Request("r", [1, 2, 3, 4, 5, 9, 1, 2, 3], SamplingParams(), max_tokens=50)
    assert NgramProposer(1, 3).propose(req, 4) == [4, 5, 9, 1]
    assert NgramProposer(1, 3).propose(Request("s", [1, 2, 3], SamplingParams(), max_tokens=5), 4) == []
    suffix = SuffixProposer(2, 8)
    done = Request("a", [7, 8], SamplingParams(), max_tokens=10)
    done.all_token_ids.extend([20, 21, 22, 23])
    suffix.finished(done)
    retry = Request("b", [7, 8], SamplingParams(), max_tokens=10)
    assert suffix.propose(retry, 3) == [20, 21, 22]     # the earlier request's output, across requests


def test_constrained_and_penalized_requests_are_not_speculated() -> None:
    spec = Speculator(parse_config({"method": "ngram"}), NgramProposer(1, 3))
    plain = Request("r", [1, 2, 3, 1, 2], SamplingParams(), max_tokens=50)
    plain.all_token_ids.append(3)
    assert spec.draft(plain, 8)
    constrained = Request("c", [1, 2, 3, 1, 2], SamplingParams(), max_tokens=50)
    constrained.all_token_ids.append(3)
    constrained.logits_processors.append(lambda ids, row: row)
    assert spec.draft(constrained, 8) == []
    penalized = Request("p", [1, 2, 3, 1, 2], SamplingParams(presence_penalty=0.5), max_tokens=50)
    penalized.all_token_ids.append(3)
    assert spec.draft(penalized, 8) == []


def test_adaptive_backoff_stops_a_request_that_keeps_missing() -> None:
    spec = Speculator(parse_config({"method": "ngram", "num_speculative_tokens": 4}), NgramProposer(1, 3))
    req = Request("r", [1, 2, 3, 1, 2], SamplingParams(), max_tokens=500)
    req.all_token_ids.append(3)
    proposed = 0
    for _ in range(100):
        draft = spec.draft(req, 8)
        if draft:
            proposed += 1
            spec.verified(req, len(draft), 0)
    assert 2 <= proposed <= 4   # a miss backs it off (16, then 32, 64 steps), and it tries again after
    hit = Request("h", [1, 2, 3, 1, 2], SamplingParams(), max_tokens=500)
    hit.all_token_ids.append(3)
    lengths = []
    for _ in range(4):   # every draft accepted: it keeps proposing, each draft longer, up to k
        draft = spec.draft(hit, 8)
        lengths.append(len(draft))
        spec.verified(hit, len(draft), len(draft))
    assert lengths == [2, 3, 3, 3]   # 2 first; then all the lookup finds (3 tokens here), k being 4


class ScriptedProposer:
    """Answers what `answer` holds and records the step of every call (steps counted by the test)."""

    def __init__(self) -> None:
        self.answer: list[int] = []
        self.asked_at: list[int] = []
        self.step = 0

    def propose(self, request: Request, k: int) -> list[int]:
        self.asked_at.append(self.step)
        return list(self.answer)

    def finished(self, request: Request) -> None:
        pass


def test_a_request_whose_proposer_finds_nothing_is_asked_less_often_then_again_after_a_hit() -> None:
    proposer = ScriptedProposer()
    spec = Speculator(parse_config({"method": "ngram", "num_speculative_tokens": 4}), proposer)
    req = Request("r", [1, 2, 3], SamplingParams(), max_tokens=500)
    req.all_token_ids.append(4)

    def steps(n: int) -> list[list[int]]:
        drafts = []
        for _ in range(n):
            proposer.step += 1
            draft = spec.draft(req, 8)
            if draft:
                drafts.append(draft)
                spec.verified(req, len(draft), len(draft))
        return drafts

    assert steps(64) == []
    # Empty proposals: skipped 1, 2, 4, 8 steps, then 16 at most (max_idle_steps).
    assert proposer.asked_at == [1, 3, 6, 11, 20, 37, 54]
    assert spec.num_proposer_calls == 7
    proposer.answer = [5, 6]
    assert steps(8) == [[5, 6], [5, 6]]      # asked again at 71 (54 + 16 + 1): a hit, then every step
    assert proposer.asked_at[7:] == [71, 72]
    proposer.answer = []
    steps(8)
    assert proposer.asked_at[9:] == [73, 75, 78]   # the streak starts again from one skipped step
    eager = ScriptedProposer()
    every = Speculator(parse_config({"method": "ngram", "max_idle_steps": 0}), eager)
    other = Request("o", [1, 2, 3], SamplingParams(), max_tokens=500)
    other.all_token_ids.append(4)
    for _ in range(5):
        every.draft(other, 8)
    assert len(eager.asked_at) == 5   # max_idle_steps 0: asked every step


def test_ngram_index_prefers_the_longest_then_the_latest_match() -> None:
    def request(ids: list[int]) -> Request:   # a fresh one each time: the index lives in request.extra
        return Request("l", ids, SamplingParams(), max_tokens=50)

    longest = [1, 2, 3, 4, 7, 2, 3, 5, 1, 2, 3]
    assert NgramProposer(2, 4).propose(request(longest), 3) == [4, 7, 2]   # (1, 2, 3) at 0..2 beats the later (2, 3)
    latest = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3]
    assert NgramProposer(2, 4).propose(request(latest), 3) == [5, 1, 2]    # two (1, 2, 3): the latest
    assert NgramProposer(2, 2).propose(request(longest), 3) == [5, 1, 2]   # max_n 2: (2, 3) latest at 5..6
    grows = Request("g", [9, 8, 1, 2], SamplingParams(), max_tokens=50)
    proposer = NgramProposer(2, 4)
    assert proposer.propose(grows, 2) == []
    grows.all_token_ids.extend([6, 9, 8])     # indexed incrementally: (9, 8) seen at 0..1
    assert proposer.propose(grows, 2) == [1, 2]


async def test_w1_like_traffic_runs_the_plain_steps_of_speculation_off(make_kernel, events, demo_model_dir):
    """Nothing repeats (random prompts on the random model): with speculation on, every step is the
    step it would be with speculation off (same tokens, same batch), and the proposer is asked for a
    small fraction of the request-steps."""
    rng = random.Random(5)
    prompts = [[rng.randrange(10, 2048) for _ in range(40)] for _ in range(6)]
    runs = {}
    for name, spec in (("off", None), ("on", {"method": "ngram", "num_speculative_tokens": 8})):
        events.events.clear()
        # NOTE: single steps both ways: with speculation off, decode bursts (core/burst.py) would run several
        # steps a call, which speculation on never does
        async with make_kernel(model=demo_model_dir, speculative_config=spec, num_scheduler_steps=1) as kernel:
            results = await _run_all(kernel, prompts, 48, stagger=False)
            steps = [(e.num_tokens, e.num_requests) for e in events.events if isinstance(e, StepDone)]
            runs[name] = (results, steps, kernel.speculator)
    (off, off_steps, _), (on, on_steps, spec) = runs["off"], runs["on"]
    assert on == off
    assert spec.num_draft_tokens == 0 and on_steps == off_steps
    decode_request_steps = sum(n for _, n in on_steps) - len(prompts)
    assert spec.num_proposer_calls <= decode_request_steps // 4, (spec.num_proposer_calls, decode_request_steps)


def test_speculative_config_is_vllm_json_and_bad_input_is_refused() -> None:
    cfg = parse_config('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5, '
                       '"prompt_lookup_min": 2}')
    assert (cfg.method, cfg.num_speculative_tokens, cfg.prompt_lookup_max, cfg.prompt_lookup_min) == ("ngram", 3, 5, 2)
    assert parse_config(None) is None
    for bad in ({"method": "eagle"}, {"method": "ngram", "num_speculative_tokens": 0},
                {"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 2},
                {"method": "ngram", "disable_by_batch_size": 0}, {"method": "ngram", "max_idle_steps": -1},
                "{not json"):
        with pytest.raises(ConfigError):
            KernelConfig(speculative_config=bad if isinstance(bad, dict) else None) if isinstance(bad, dict) \
                else parse_config(bad)


async def test_metrics_and_ledger_show_acceptance(make_kernel, events, demo_model_dir, tmp_path) -> None:
    import sqlite3

    from modelcall.events import Finished
    from modelcall.plugins.metrics.plugin import metrics_for

    path = tmp_path / "ledger.sqlite3"
    async with make_kernel(model=demo_model_dir, speculative_config={"method": "suffix", "num_speculative_tokens": 4},
                           plugin_config={"ledger": {"path": str(path)}}) as kernel:
        for _ in range(2):   # the retry is proposed the first one's output
            await kernel.complete(prompt_token_ids=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
        spec = kernel.speculator
        text = metrics_for(kernel).exposition().decode()
    assert spec.num_accepted_tokens > 0
    assert f'modelcall:spec_decode_num_accepted_tokens_total{{model_name="{kernel.model_name}"}} ' \
           f'{float(spec.num_accepted_tokens)}' in text
    assert f'modelcall:spec_decode_num_draft_tokens_total{{model_name="{kernel.model_name}"}} ' \
           f'{float(spec.num_draft_tokens)}' in text
    assert 'modelcall:spec_decode_num_accepted_tokens_per_pos_total{model_name=' in text
    finished = [e for e in events.events if isinstance(e, Finished)]
    assert sum(e.spec_accepted_tokens for e in finished) == spec.num_accepted_tokens
    assert sum(e.spec_draft_tokens for e in finished) == spec.num_draft_tokens
    rows = sqlite3.connect(path).execute("SELECT spec_draft_tokens, spec_accepted_tokens FROM requests "
                                         "ORDER BY received").fetchall()
    assert len(rows) == 2 and rows[1][1] > 0 and sum(r[0] for r in rows) == spec.num_draft_tokens


def test_cli_takes_the_speculative_config_json() -> None:
    import argparse

    from modelcall.core.commands import CommandError, add_kernel_options, config_from_args

    parser = argparse.ArgumentParser()
    add_kernel_options(parser)
    cfg = config_from_args(parser.parse_args(["--speculative-config", '{"method": "suffix", "num_speculative_tokens": 8}']))
    assert parse_config(cfg.speculative_config).num_speculative_tokens == 8
    assert config_from_args(parser.parse_args([])).speculative_config is None
    for bad in ('{"method": "medusa"}', "ngram"):
        with pytest.raises(CommandError):
            config_from_args(parser.parse_args(["--speculative-config", bad]))
