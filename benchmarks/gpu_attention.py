"""benchmarks/gpu_figures.py's attention figure: each paged-attention candidate (the Triton kernel, the portable torch
path) at the decode and prefill shapes, checked against the torch path in fp32 and timed; the fastest correct one is
chosen for the engine figures."""
from __future__ import annotations

import statistics
import time
import traceback
from typing import Any

from gpu_common import sync

ATTENTION_TOL = {"float32": 1e-4, "bfloat16": 2e-2}   # |candidate - torch path in fp32|, outputs of size ~1



def attention_figure(sz: dict, device: Any, dtype_name: str, bandwidth: float | None) -> dict:
    """Each paged-attention candidate at the decode and prefill shapes: error against the torch path in fp32,
    median time, bytes floor; the fastest correct candidate is `chosen`."""
    import torch

    from modelcall.plugins.runner import attention, cuda_attention
    from modelcall.plugins.runner.batch import StepBatch, _context_slots

    shape = sz["model"]
    hq, hkv = shape["num_attention_heads"], shape["num_key_value_heads"]
    dim = shape["hidden_size"] // hq
    dtype = getattr(torch, dtype_name)
    bs = 16
    cases = {"decode": [(sz["prompt"] + sz["decode"] // 2, 1)] * sz["concurrency"],
             "prefill": [(sz["ttft_prompt"], sz["ttft_prompt"])] * sz["ttft_requests"]}
    candidates = {"torch": lambda q, k, v, step, var: attention._paged_torch(q, k, v, step, var, hq != hkv, 0,
                                                                              step.paged_slots)}
    if cuda_attention.available() and (device.type == "cuda" or cuda_attention.interpreting()):
        candidates["triton"] = lambda q, k, v, step, var: cuda_attention.paged_step(q, k, v, step, var,
                                                                                     step.paged_slots)
    result: dict[str, Any] = {"candidates": sorted(candidates), "block_size": bs, "dtype": dtype_name,
                              "not_compared": "flex_attention, FlashInfer, flash-attn (not built)"}
    g = torch.Generator().manual_seed(7)
    total = {name: 0.0 for name in candidates}
    for case, ctx_q in cases.items():
        n_blocks = sum(-(-c // bs) for c, _ in ctx_q)
        perm = torch.randperm(n_blocks, generator=g)
        width = max(-(-c // bs) for c, _ in ctx_q)
        table = perm.view(len(ctx_q), width)        # equal lengths here: one row of blocks per request
        slots = _context_slots(table, torch.arange(max(c for c, _ in ctx_q)), bs).to(device)
        kc = torch.randn(n_blocks * bs, hkv, dim, device=device).to(dtype)
        vc = torch.randn(n_blocks * bs, hkv, dim, device=device).to(dtype)
        n = sum(q for _, q in ctx_q)
        q_rows = torch.randn(hq, n, dim, device=device).to(dtype).transpose(0, 1)
        step = StepBatch(input_ids=torch.zeros(1, n, dtype=torch.long), positions=torch.zeros(1, n, dtype=torch.long),
                         slot_mapping=torch.zeros(n, dtype=torch.long), sample_rows=None, num_sampled=0, num_paged=n,
                         paged_slots=slots, paged_ctx_lens=[c for c, _ in ctx_q], paged_q_lens=[q for _, q in ctx_q])
        step.scratch["block_size"] = bs
        var = attention.Variant(dim ** -0.5)
        ref = attention._paged_torch(q_rows.float(), kc.float(), vc.float(), step, var, hq != hkv, 0, slots)
        kv_bytes = sum(c for c, _ in ctx_q) * hkv * dim * 2 * kc.element_size()
        entry: dict[str, Any] = {"requests": len(ctx_q), "context": ctx_q[0][0], "queries_each": ctx_q[0][1],
                                 "kv_bytes_floor": kv_bytes}
        reps = 10 if device.type == "cuda" else 1
        for name, fn in candidates.items():
            try:
                got = fn(q_rows, kc, vc, step, var)
                err = float((got.float() - ref).abs().max())
                times = []
                for i in range(reps + 2):
                    step.scratch.pop(("torch_paged", None, 0), None)   # per-step metadata is part of the cost
                    step.scratch.pop(("triton_meta", 0), None)
                    sync(device)
                    t0 = time.perf_counter()
                    fn(q_rows, kc, vc, step, var)
                    sync(device)
                    if i >= 2 or device.type != "cuda":
                        times.append(time.perf_counter() - t0)
                t = statistics.median(times)
                entry[name] = {"max_abs_err": err, "ok": err <= ATTENTION_TOL[dtype_name], "median_s": t,
                               "kv_bytes_per_s": kv_bytes / t,
                               "fraction_of_bandwidth": kv_bytes / t / bandwidth if bandwidth else None}
                interpreted = name == "triton" and device.type != "cuda"   # checked, never chosen on its timing
                entry[name]["interpreted"] = interpreted
                total[name] += t if entry[name]["ok"] and not interpreted else float("inf")
            except Exception as e:  # noqa: BLE001 - a failing candidate is recorded and not chosen
                entry[name] = {"error": repr(e), "trace": traceback.format_exc()[-1500:]}
                total[name] = float("inf")
        result[case] = entry
    best = min(total, key=total.get)
    result["chosen"] = best if total[best] < float("inf") else "torch"
    result["chosen_by"] = "least decode + prefill time among candidates within tolerance"
    return result
