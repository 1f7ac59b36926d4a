"""Auth behaviours a hand-run mutation pass (docs/mutation.md) found no test for: a key is refused
from its `expires_at` instant on, not only after it; and a request's own `cache_salt` only narrows
its tenant's prefix-cache scope: two tenants sending the same salt still share no block."""
from __future__ import annotations

import datetime as dt
import hashlib

import pytest

from modelcall.core import SamplingParams
from modelcall.core.metering import Caller
from modelcall.core.submit import GenerateRequest
from modelcall.plugins.auth.keys import KeyEntry, KeyStore

PROMPT = [(13 * i) % 800 + 100 for i in range(40)]  # 2 full blocks of 16 and a partial one


def test_a_key_is_expired_at_its_expires_at_instant_and_active_just_before():
    at = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    entry = KeyEntry(name="k", sha256=hashlib.sha256(b"key").hexdigest(), expires_at=at)
    exp = at.timestamp()
    assert entry.state(now=exp - 0.001) == "active"
    assert entry.state(now=exp) == "expired"
    assert entry.state(now=exp + 1) == "expired"
    # a naive datetime in the key file means UTC
    naive = KeyEntry(name="n", sha256=entry.sha256, expires_at=at.replace(tzinfo=None))
    assert naive.state(now=exp) == "expired" and naive.state(now=exp - 1) == "active"
    # the store refuses the key whose expiry has come (verify uses the wall clock)
    past = KeyEntry(name="p", sha256=entry.sha256, expires_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1))
    assert KeyStore([past]).verify("key") is None
    soon = KeyEntry(name="s", sha256=entry.sha256, expires_at=dt.datetime.now(dt.UTC) + dt.timedelta(days=1))
    assert KeyStore([soon]).verify("key").name == "s"


@pytest.mark.anyio
async def test_the_same_cache_salt_from_two_tenants_shares_no_prefix_block(make_kernel, demo_model_dir):
    a, b = Caller(name="tenant-a"), Caller(name="tenant-b")
    params = SamplingParams(max_tokens=1, temperature=0)

    async def cached(caller: Caller, salt: str | None) -> int:
        done = await kernel.complete(GenerateRequest(prompt_token_ids=PROMPT, params=params, caller=caller,
                                                     cache_salt=salt))
        return done.usage.cached_tokens

    async with make_kernel(model=demo_model_dir, block_size=16) as kernel:
        assert await cached(a, "shared") == 0
        assert await cached(a, "shared") == 32       # the tenant's own blocks serve it again
        assert await cached(b, "shared") == 0        # another tenant, the same salt: nothing
        assert await cached(a, None) == 0            # a salt narrows the scope: unsalted is another root
