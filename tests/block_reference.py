"""The block attention kernel's check against masked softmax in fp64, shared by tests/test_cascade.py and the
process it starts on the other bf16 path (this module imports only torch and the kernel: the child starts fast)."""
from __future__ import annotations

import sys

import torch

from modelcall.plugins.runner import cpu_kernel

# (rows, query heads, KV heads, head size, keys, dtype): tiles of 32 lanes cut across rows and their group heads
# (GQA/MQA), a last partial tile, an odd key count, head sizes off the 16 x 16 transposes (48, 40)
CASES = [(70, 8, 8, 64, 200, torch.float32), (33, 8, 2, 64, 33, torch.bfloat16), (5, 6, 3, 48, 300, torch.float32),
         (40, 4, 1, 32, 1000, torch.float32), (19, 6, 3, 48, 77, torch.bfloat16), (21, 4, 2, 40, 150, torch.bfloat16)]


def check(m: int, hq: int, hkv: int, d: int, keys: int, dtype: torch.dtype) -> None:
    """block_attention over scattered slots, row r seeing keys 0..last[r] (and then all keys), against fp64; its
    log-sum-exp; and into a bf16 `out`, the fp32 result's bits as .to(bf16) rounds them."""
    g = torch.Generator().manual_seed(m + keys)
    kc = torch.randn(4000, hkv, d, generator=g).to(dtype)
    vc = torch.randn(4000, hkv, d, generator=g).to(dtype)
    slots = torch.randperm(4000, generator=g)[:keys]
    q = torch.randn(m, hq, d, generator=g).to(dtype)
    for last in (keys - m + torch.arange(m), None):
        out, lse = cpu_kernel.block_attention(q, kc, vc, slots, d ** -0.5, last)
        k = kc[slots].double().transpose(0, 1).repeat_interleave(hq // hkv, 0)
        v = vc[slots].double().transpose(0, 1).repeat_interleave(hq // hkv, 0)
        s = q.double().transpose(0, 1) @ k.transpose(1, 2) * d ** -0.5                 # [Hq, m, keys]
        if last is not None:
            s = s.masked_fill(torch.arange(keys)[None, None, :] > last[None, :, None], float("-inf"))
        want = (torch.softmax(s, -1) @ v).transpose(0, 1)
        assert (out.double() - want).abs().max().item() < (1e-5 if dtype == torch.float32 else 4e-3)
        assert (lse.double() - torch.logsumexp(s, -1).transpose(0, 1)).abs().max().item() < 1e-4
        # written in the model's dtype: the same values, rounded as .to() rounds
        into = torch.empty(m, hq, d, dtype=torch.bfloat16)
        got, no_lse = cpu_kernel.block_attention(q, kc, vc, slots, d ** -0.5, last, with_lse=False, out=into)
        assert got is into and no_lse is None and torch.equal(into, out.to(torch.bfloat16))


if __name__ == "__main__":   # MODELCALL_BLOCK_PAIRS=0|1 python block_reference.py 0|1
    torch.set_num_threads(1)
    assert cpu_kernel.block_uses_pairs() == (sys.argv[1] == "1"), "the asked-for path was not taken"
    for case in CASES:
        check(*case)
    print(f"{len(CASES)} cases passed")
