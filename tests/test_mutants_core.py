"""Core behaviours a hand-run mutation pass (docs/mutation.md) found no test for: the entry pipeline's
queue limit is `max_queued` requests waiting, not one more."""
from __future__ import annotations

import pytest

from modelcall.core import Overloaded, SamplingParams
from modelcall.core.submit import GenerateRequest

pytestmark = pytest.mark.anyio

PROMPT = [(7 * i) % 900 + 100 for i in range(24)]


async def test_max_queued_waiting_requests_are_admitted_and_the_next_is_refused(make_kernel, demo_model_dir):
    # One running slot, one waiting place: A runs (a long generation), B waits, C finds the queue full.
    # NOTE: B and C are submitted with no await that lets A finish (A has 1500 tokens to go).
    long = SamplingParams(max_tokens=1500, temperature=0, ignore_eos=True)
    async with make_kernel(model=demo_model_dir, max_num_seqs=1, max_queued=1) as kernel:
        a = await kernel.submit(GenerateRequest(prompt_token_ids=PROMPT, params=long))
        b = await kernel.submit(GenerateRequest(prompt_token_ids=PROMPT, params=long))
        with pytest.raises(Overloaded, match=r"1 requests are waiting \(limit 1\)"):
            await kernel.submit(GenerateRequest(prompt_token_ids=PROMPT, params=long))
        a.close()
        b.close()
