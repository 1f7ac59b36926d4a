"""block_attention (plugins/runner/csrc/attention_block.c) alone, this tree's source against the one at `--base`, and torch's
flash attention (SDPA) on the same inputs, calls alternating in one process (A B C A B C ...), one thread by default.

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE taskset -c 1 .venv/bin/python benchmarks/block_attention.py
        [--base 0373de0] [--variants base,pairs,fp32,auto] [--cases bf16-64,bf16-128,bf16-gqa,fp32-64] [--len 1920]
        [--reps 5]

Cases (W3's prefill shape by default: one 1,920-token causal chunk): `bf16-64` 8 heads x 64, bf16 queries over a bf16
cache; `bf16-128` 8 x 128; `bf16-gqa` 16 query heads over 4 KV heads x 64; `fp32-64` fp32 queries and cache;
`bf16-cascade` / `bf16-cascadegqa` a shared prefix (32 rows x 8 heads / 8 rows x 8 over 2 KV heads, every row over all
`--len` keys, no mask, as cascade.py calls it). The cache holds the keys in 16-slot blocks scattered over a pool 4x
their size ([slots, Hkv, D], as the runner's). Variants: `base` (--base's attention_block.c), `base-nopairs` (the same
with its bf16 pairs turned off: its fp32 path on widened bf16, where the base has the `pairs` line), `auto` (this
tree's, the pairs or the fp32 GEMMs as measured at first call), `pairs` / `fp32` (this tree's, MODELCALL_BLOCK_PAIRS=1
/ 0). Each variant is its own library (the source tagged with its name), so each makes its own choice once.

Per case: median CPU ms per call (thread time) of each, GFLOP/s of the useful products (4 * d * Hq per query-key pair
seen: the causal triangle, or rows x keys), max |error| of the fp32 output against an fp64 SDPA (SDPA's own output is
in the inputs' dtype), and per-round ratios against the first variant and against SDPA.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from modelcall.core import native  # noqa: E402
from modelcall.plugins.runner import cpu_kernel  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = {"64": (8, 8, 64), "128": (8, 8, 128), "gqa": (16, 4, 64), "cascade": (8, 8, 64), "cascadegqa": (8, 2, 64)}


BLOCK = os.path.join(cpu_kernel.CSRC, "attention_block.c")


def block_source(rev: str) -> str:
    """attention_block.c as of `rev` (a rev from before the C moved into plugins/runner/csrc/ has none: git says so)"""
    return subprocess.run(["git", "show", f"{rev}:plugins/runner/csrc/attention_block.c"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout


def build(name: str, base: str):
    """(library, MODELCALL_BLOCK_PAIRS for its first call or None)"""
    blk = block_source(base) if name.startswith("base") else open(BLOCK).read()
    if name == "base-nopairs":
        line = "const int pairs = qb && bf16 && d % 2 == 0;"
        assert line in blk, "the base has no such pairs line"
        blk = blk.replace(line, "const int pairs = 0;")
    variant = os.path.join(tempfile.mkdtemp(prefix="block_attention_"), "attention_block.c")
    with open(variant, "w") as f:
        f.write(blk + f"\n/* benchmarks/block_attention.py: {name} */\n")
    sources = [variant if path == BLOCK else path for path in cpu_kernel.SOURCES]
    lib = native.compile_library("bench_block_" + name.replace("-", "_"), sources=sources,
                                 include_dirs=(cpu_kernel.CSRC,))
    cpu_kernel._declare(lib)
    env = {"pairs": "1", "fp32": "0"}.get(name)
    if env is not None:   # the choice is made once, at the library's first bf16 call
        os.environ["MODELCALL_BLOCK_PAIRS"] = env
    q = torch.randn(40, 2, 32).bfloat16()
    call(lib, q, q, q, torch.arange(40), 0.1, None, torch.empty(40, 2, 32))
    os.environ.pop("MODELCALL_BLOCK_PAIRS", None)
    return lib


def call(lib, q, kc, vc, slots, scale, last, out):
    """cpu_kernel.block_attention's call, on `lib`"""
    m, hq, d = q.shape
    pairs = q.dtype == torch.bfloat16 and kc.dtype == torch.bfloat16 and d % 2 == 0
    qb = q.contiguous() if pairs else None
    qf = None if pairs else q.float().contiguous()
    lib.block_attention(qf.data_ptr() if qf is not None else None, qb.data_ptr() if qb is not None else None,
                        out.data_ptr(), int(out.dtype == torch.bfloat16), None, kc.data_ptr(), vc.data_ptr(),
                        int(kc.dtype == torch.bfloat16), slots.data_ptr(), slots.numel(),
                        last.data_ptr() if last is not None else None, m, hq, kc.shape[1], d, scale,
                        torch.get_num_threads())
    return out


def make(spec: str, keys: int):
    dt, shape = spec.split("-")
    hq, hkv, d = SHAPES[shape]
    dtype = torch.bfloat16 if dt == "bf16" else torch.float32
    g = torch.Generator().manual_seed(0)
    bs, nb = 16, -(-keys // 16)
    blocks = torch.randperm(nb * 4, generator=g)[:nb]
    slots = (blocks[:, None] * bs + torch.arange(bs)).flatten()[:keys].contiguous()
    kc = torch.randn(nb * 4 * bs, hkv, d, generator=g).to(dtype)
    vc = torch.randn(nb * 4 * bs, hkv, d, generator=g).to(dtype)
    m, last = keys, torch.arange(keys)
    if shape.startswith("cascade"):
        m, last = (32 if shape == "cascade" else 8), None
    q = torch.randn(m, hq, d, generator=g).to(dtype)
    return q, kc, vc, slots, last, d ** -0.5


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="HEAD")
    ap.add_argument("--variants", default="base,auto")
    ap.add_argument("--cases", default="bf16-64,bf16-128,bf16-gqa,fp32-64")
    ap.add_argument("--len", type=int, default=1920)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    names = args.variants.split(",")
    libs = {n: build(n, args.base) for n in names}
    print(f"base {args.base}, {torch.get_num_threads()} thread(s)")
    for spec in args.cases.split(","):
        q, kc, vc, slots, last, scale = make(spec, args.len)
        m, hq, d = q.shape
        hkv, keys = kc.shape[1], slots.numel()
        flops = 4.0 * d * hq * (keys * (keys + 1) / 2 if last is not None else m * keys)
        qs = q.transpose(0, 1).unsqueeze(0)
        ks = kc[slots].transpose(0, 1).unsqueeze(0).contiguous()
        vs = vc[slots].transpose(0, 1).unsqueeze(0).contiguous()
        causal, gqa = last is not None, hq != hkv

        def sdpa():
            return F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=scale, enable_gqa=gqa)

        ref = F.scaled_dot_product_attention(qs.double(), ks.double(), vs.double(), is_causal=causal, scale=scale,
                                             enable_gqa=gqa)[0].transpose(0, 1)
        fns = {"sdpa": sdpa}
        for n, lib in libs.items():
            fns[n] = (lambda lib=lib, out=torch.empty(m, hq, d): call(lib, q, kc, vc, slots, scale, last, out))
        errs = {}
        for n, fn in fns.items():
            o = fn()
            errs[n] = ((o[0].transpose(0, 1) if n == "sdpa" else o).double() - ref).abs().max().item()
        times: dict[str, list[float]] = {n: [] for n in fns}
        for _ in range(args.reps):
            for n, fn in fns.items():
                t0 = time.thread_time()
                fn()
                times[n].append((time.thread_time() - t0) * 1e3)
        print(f"== {spec}: {m} queries x {hq} heads over {keys} keys x {hkv} KV heads, d {d}, {q.dtype}, "
              f"{'causal' if causal else 'no mask'} ({flops / 1e9:.2f} GFLOP)")
        for n in fns:
            med = statistics.median(times[n])
            print(f"  {n:13s} {med:8.2f} ms ({', '.join(f'{t:.1f}' for t in times[n])})  {flops / med / 1e6:6.1f} "
                  f"GFLOP/s  max|err| {errs[n]:.2e}")
        for n in names[1:]:
            r = [a / b for a, b in zip(times[names[0]], times[n])]
            print(f"  {names[0]}/{n}: {', '.join(f'{x:.2f}' for x in r)} (median {statistics.median(r):.2f})")
        for n in names:
            r = [a / b for a, b in zip(times["sdpa"], times[n])]
            print(f"  sdpa/{n}: {', '.join(f'{x:.2f}' for x in r)} (median {statistics.median(r):.2f})")


if __name__ == "__main__":
    main()
