"""One device-to-host transfer per step: the runner and sampler keep every tensor on the model's device until
one `.tolist()` of the step's chosen tokens (with their logprobs, when asked, in the same block).

Counted on CPU through every Tensor method that reads device data on the host (`tolist`, `item`, `cpu`,
`numpy`, and `__bool__`/`__int__`/`__float__`/`__index__`, which an `if tensor:` or `int(tensor)` calls): on
CUDA each of them would wait for the GPU. Greedy, sampled (temperature, top-k, top-p, min-p, seeds) and
logprobs with penalties, over prefill then decode steps.
"""
from __future__ import annotations

import collections
import traceback

import pytest
import torch

from paged_cases import run_steps

from modelcall.core import KernelConfig, Request, SamplingParams
from modelcall.plugins.runner.runner import TorchModelRunner
from modelcall.plugins.sampler.sampler import TorchSampler

READS = ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


@pytest.fixture(scope="module")
def runner(demo_model_dir):
    r = TorchModelRunner(KernelConfig(model=demo_model_dir, dtype="float32", threads=1), demo_model_dir,
                         TorchSampler())
    r.allocate_kv_cache(64, 4)
    return r


@pytest.fixture
def host_reads(monkeypatch):
    """Every host read of tensor data while the test runs, by the plugin source line that asked for it."""
    seen: collections.Counter = collections.Counter()
    for name in READS:
        real = getattr(torch.Tensor, name)

        def read(self, *a, _real=real, _name=name, **k):
            caller = traceback.extract_stack(limit=2)[0]
            seen[(_name, caller.filename.rsplit("/", 1)[-1], caller.lineno)] += 1
            return _real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, read)
    return seen


CASES = {
    "greedy": [SamplingParams(temperature=0)] * 3,
    "sampled": [SamplingParams(temperature=0.8, top_p=0.9, top_k=20, seed=3), SamplingParams(temperature=0),
                SamplingParams(temperature=1.0, min_p=0.1)],
    "logprobs_penalties": [SamplingParams(temperature=0.8, logprobs=2),
                           SamplingParams(temperature=0, repetition_penalty=1.2, presence_penalty=0.5,
                                          logprobs=0)],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_host_transfer_per_step(runner, host_reads, case):
    reqs = [Request(f"r{i}", [11 + i, 20, 30, 40 + i, 50][: 2 + i], p, max_tokens=8)
            for i, p in enumerate(CASES[case])]

    def measure(step, execute):      # a prefill step, then decodes
        host_reads.clear()
        out = execute()
        reads = sum(host_reads.values())
        assert reads == 1, f"{case} step {step}: {reads} host reads: {dict(host_reads)}"
        assert all(isinstance(t, int) for t in out.token_ids)
        if case == "logprobs_penalties":
            assert out.logprobs[0].token_id == out.token_ids[0] and len(out.logprobs[0].top) == 2
        return out

    run_steps(runner, reqs, 3, 4, measure)
