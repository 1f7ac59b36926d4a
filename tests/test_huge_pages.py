"""plugins/runner/huge_pages.py: weights moved onto 2 MiB pages in place (every given tensor, views and their bases
included, points at its copy; the old storage is freed), and the KV pool advised before it is written."""
from __future__ import annotations

import pytest
import torch

from modelcall.plugins.runner import huge_pages, quant

THP = open("/sys/kernel/mm/transparent_hugepage/enabled").read() if huge_pages._madvise() else ""
needs_thp = pytest.mark.skipif("[never]" in THP or not THP, reason="no transparent huge pages on this machine")
MB = 1 << 20


def _use_count(s: torch.UntypedStorage) -> int:
    return torch._C._storage_Use_Count(s._cdata)


@needs_thp
def test_rehome_moves_views_and_bases_and_frees_the_old_storage():
    torch.manual_seed(0)
    fused = torch.randn(3 * MB // 1024, 256)   # 3 MiB, as lean fuses q|k|v (torch.cat: a tensor of its own)
    parts = [fused[:1000], fused[1000:2000], fused[2000:]]                    # the modules' views of it
    other = torch.randint(0, 255, (5 * MB,), dtype=torch.uint8)
    strided = torch.randn(512, 1024).t()                                      # a non-contiguous view
    want = [t.clone() for t in (fused, *parts, other, strided)]
    old = fused.untyped_storage()
    # the parts alone are handed over, as module_tensors finds a fused weight's parts: their base comes along
    got = huge_pages.rehome([*parts, other, strided], min_bytes=0)
    assert got is not None and got.storages == 3
    for t, w in zip((fused, *parts, other, strided), want):
        assert torch.equal(t, w)
    assert strided.stride() == (1, 1024)
    arena = fused.untyped_storage()
    assert arena.data_ptr() != old.data_ptr()
    assert {t.untyped_storage().data_ptr() for t in (*parts, other, strided)} == {arena.data_ptr()}
    assert _use_count(old) == 1, "something still holds the weights' old storage (a view's base not moved)"
    assert got.huge_bytes >= 0.9 * got.arena_bytes, got
    assert huge_pages.huge_bytes_in(parts[0].data_ptr(), 2 * MB) == 2 * MB


def test_rehome_leaves_small_sets_and_other_devices_alone():
    t = torch.ones(1000)
    before = t.data_ptr()
    assert huge_pages.rehome([t]) is None          # under min_bytes: nothing to gain
    assert huge_pages.rehome([t.to("meta")], min_bytes=0) is None
    assert t.data_ptr() == before


@needs_thp
def test_module_tensors_find_quantized_weights_and_parameters():
    torch.manual_seed(1)
    qw = quant.quantize(torch.randn(2048, 1024), quant.GGML_TYPES["Q8_0"])
    lin = quant.QuantLinear(qw, None)
    model = torch.nn.Sequential(lin, torch.nn.LayerNorm(2048))
    x = torch.randn(3, 1024)
    want = model(x)
    got = huge_pages.rehome(huge_pages.module_tensors(model), min_bytes=0)
    assert got is not None and got.arena_bytes >= qw.data.numel()
    assert torch.equal(model(x), want)
    assert huge_pages.huge_bytes_in(lin.qweight.data.data_ptr(), 1) == 1


@needs_thp
def test_advise_makes_a_fresh_tensor_fault_in_huge():
    # NOTE: 80 MiB, over glibc's mmap threshold (heap.keep_freed_memory raises it to 64 MiB): fresh pages, as the KV
    # pool's. Heap memory in use before keeps the small pages it was written on.
    t = torch.empty(80 * MB, dtype=torch.uint8)
    assert huge_pages.advise(t)
    t.zero_()
    lo = -(-t.data_ptr() // huge_pages.HUGE) * huge_pages.HUGE
    assert huge_pages.huge_bytes_in(lo, 4 * MB) == 4 * MB
