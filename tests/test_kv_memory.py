"""The CPU KV pool (plugins/runner/kv_memory.py): zeros that take no memory until written."""
from __future__ import annotations

import os

import pytest
import torch

from modelcall.plugins.runner.kv_memory import zeroed_pool


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident size from /proc")
def test_a_pool_reads_as_zeros_and_takes_memory_only_where_written():
    before = _rss_bytes()
    pool = zeroed_pool((2, 64 << 20), torch.bfloat16)   # 256 MB
    assert pool.shape == (2, 64 << 20) and pool.dtype == torch.bfloat16 and pool.is_contiguous()
    assert _rss_bytes() - before < 16 << 20              # nothing written yet: nothing resident
    pool[1, :1000] = 3.0
    assert pool[1, :1000].eq(3.0).all() and pool[1, 1000:2000].eq(0).all()
    assert int(pool[0].count_nonzero()) == 0            # every byte of the unwritten half reads as zero
    assert _rss_bytes() - before < 64 << 20             # reading zeros maps the shared zero page, not memory


def test_an_empty_pool_is_a_plain_tensor():
    assert zeroed_pool((0, 4), torch.float32).shape == (0, 4)
