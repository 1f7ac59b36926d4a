"""The figures of issue 16 in one process, written as JSON: device copy bandwidth, decode at 256 concurrent
requests as a fraction of that bandwidth, the same workload through transformers' continuous batching
(`generate_batch`) for the ratio, TTFT at 64 x 1,024 prompt tokens, CUDA graphs on vs off, greedy parity
with transformers (fp32 exact, bf16 within a stated tolerance), and the paged-attention path chosen by a
micro-benchmark of the candidates (the Triton kernel, the portable torch path) at the decode and prefill shapes.

    python benchmarks/gpu_figures.py --out figures.json            # on a GPU: 1B Llama-shaped, bf16
    python benchmarks/gpu_figures.py --out figures.json --dry-run  # tiny sizes on CPU (checks the script)

The model is a Llama-3.2-1B-shaped config with random weights, built on the device (no download) and saved
to a scratch directory for the runner to load. Each figure is measured in its own try block: one that fails
records its error and the others still run. A figure the engine cannot produce yet is recorded as
"not built", never as a number.

Decode bandwidth: bytes read per decode step = every weight once (the lm_head included) + each request's
K and V over its context (prompt + half the decode length, the mean over the decode steps), divided by
the median step time (StepDone.step_s) of the steps that decode all requests at once.

Attention: each candidate runs one layer's paged attention of the decode step (concurrency x 1 query over
prompt + decode/2 context) and of a prefill (ttft_requests x ttft_prompt queries over their own K/V read from
the cache), is checked against the torch path in fp32, and timed (CUDA-event median); the fastest correct one is
`chosen` and the engine figures run with it (runner `attention`). The bytes floor is K and V read once.
On the CPU dry run the Triton kernel runs in its interpreter (TRITON_INTERPRET=1): checked, not timed usefully.

This file holds the engine figures and the run; gpu_attention.py (the candidates), gpu_parity.py (greedy parity)
and gpu_common.py (model, prompts, bandwidth, the step observer) sit beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
from gpu_attention import attention_figure  # noqa: E402
from gpu_common import (  # noqa: E402
    StepLog, build_model_dir, complete_all, kv_bytes_per_token, measure_bandwidth, random_prompts, sync,
)
from gpu_parity import parity  # noqa: E402

# Llama 3.2 1B's shape: 1.24e9 parameters with tied embeddings.
FULL = dict(model=dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                       num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True,
                       max_position_embeddings=4096),
            concurrency=256, prompt=128, decode=128, ttft_requests=64, ttft_prompt=1024,
            parity_model=dict(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                              num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024),
            parity_prompts=8, parity_tokens=32, copy_bytes=2 << 30, kv_gb=16.0, batched_tokens=8192)
DRY = dict(model=dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                      max_position_embeddings=512),
           concurrency=8, prompt=16, decode=8, ttft_requests=4, ttft_prompt=32,
           parity_model=dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512),
           parity_prompts=3, parity_tokens=8, copy_bytes=32 << 20, kv_gb=0.25, batched_tokens=512)

FIGURE_KEYS = ("device", "model", "bandwidth", "attention", "decode", "transformers_decode", "ttft", "cuda_graphs",
               "parity_fp32", "parity_bf16")
async def decode_run(kernel: Any, steps: StepLog, sz: dict) -> tuple[list[Any], float, list[Any]]:
    """The decode workload (after a warm-up): (results, wall seconds, StepDone of the all-requests decode steps)."""
    vocab = sz["model"]["vocab_size"]
    # warm-up: allocator, kernels' first launches, any compilation (and graph capture of the warm-up's bucket)
    await complete_all(kernel, random_prompts(min(8, sz["concurrency"]), sz["prompt"], vocab, 1), 4)
    kernel.kv.reset_prefix_cache()
    prompts = random_prompts(sz["concurrency"], sz["prompt"], vocab, 2)
    steps.steps.clear()
    t0 = time.perf_counter()
    done = await complete_all(kernel, prompts, sz["decode"])
    wall = time.perf_counter() - t0
    full = [s for s in steps.steps if s.num_requests == sz["concurrency"] and s.num_tokens == sz["concurrency"]]
    return done, wall, full


def engine_config(args: Any, sz: dict, model_dir: str, dtype_name: str, runner_cfg: dict) -> Any:
    from modelcall.core import KernelConfig
    return KernelConfig(model=model_dir, device=args.device, dtype=dtype_name, max_num_seqs=max(256, sz["concurrency"]),
                        max_num_batched_tokens=sz["batched_tokens"], kv_cache_memory_gb=sz["kv_gb"],
                        num_scheduler_steps=1,   # one forward a StepDone: its step times are the figures (CPU dry run)
                        plugin_config={"runner": runner_cfg})


async def modelcall_figures(args: Any, sz: dict, model_dir: str, weight_bytes: int, dtype_name: str,
                            bandwidth: float | None, out: dict, runner_cfg: dict) -> list[list[int]] | None:
    """decode and ttft through one kernel (graphs off); returns the decode outputs (for the graphs figure)."""
    from modelcall.core import Kernel

    steps = StepLog()
    decoded = None
    async with Kernel(engine_config(args, sz, model_dir, dtype_name, runner_cfg), plugins=[steps]) as kernel:
        shape = sz["model"]
        vocab = shape["vocab_size"]
        try:
            done, wall, full = await decode_run(kernel, steps, sz)
            decoded = [list(d.token_ids) for d in done]
            step_s = statistics.median(s.step_s for s in full) if full else None
            forward_s = statistics.median(s.forward_s for s in full) if full else None
            kv_elem = 2 if dtype_name == "bfloat16" else 4
            kv_read = sz["concurrency"] * (sz["prompt"] + sz["decode"] / 2) * kv_bytes_per_token(shape, kv_elem)
            per_step = weight_bytes + kv_read
            tokens = sum(len(d.token_ids) for d in done)
            out["decode"] = {
                "concurrency": sz["concurrency"], "prompt_tokens": sz["prompt"], "decode_tokens": sz["decode"],
                "output_tokens": tokens, "wall_s": wall, "output_tok_per_s": tokens / wall,
                "full_decode_steps": len(full), "median_step_s": step_s, "median_forward_s": forward_s,
                "bytes_per_step": per_step, "weight_bytes": weight_bytes, "kv_bytes_per_step": kv_read,
                "achieved_bytes_per_s": per_step / step_s if step_s else None,
                "fraction_of_bandwidth": (per_step / step_s / bandwidth) if step_s and bandwidth else None,
                "target_fraction": 0.60, "attention": kernel.runner.attention_backend or "torch",
                "cuda_graphs": False,
            }
        except Exception as e:  # noqa: BLE001 - recorded, the other figures still run
            out["decode"] = {"error": repr(e), "trace": traceback.format_exc()[-2000:]}
        try:
            kernel.kv.reset_prefix_cache()
            prompts = random_prompts(sz["ttft_requests"], sz["ttft_prompt"], vocab, 3)
            done = await complete_all(kernel, prompts, 1)
            ttft = sorted(d.finished.timings.first_token - d.finished.timings.received for d in done)
            out["ttft"] = {"requests": len(prompts), "prompt_tokens": sz["ttft_prompt"],
                           "median_s": statistics.median(ttft), "max_s": ttft[-1], "min_s": ttft[0],
                           "max_num_batched_tokens": sz["batched_tokens"]}
        except Exception as e:  # noqa: BLE001
            out["ttft"] = {"error": repr(e), "trace": traceback.format_exc()[-2000:]}
    return decoded


async def graphs_figure(args: Any, sz: dict, model_dir: str, dtype_name: str, runner_cfg: dict,
                        off: dict, off_tokens: list[list[int]] | None) -> dict:
    """The decode workload again with decode CUDA graphs on (on CPU: the same static batches, eager), against
    the graphs-off run's median step and its greedy outputs."""
    from modelcall.core import Kernel

    mode = True if args.device.startswith("cuda") else "eager"
    cfg = {**runner_cfg, "cuda_graphs": mode}
    if mode is True:
        cfg["attention"] = "triton"     # a captured step reads only device buffers: the Triton kernel's
    steps = StepLog()
    async with Kernel(engine_config(args, sz, model_dir, dtype_name, cfg), plugins=[steps]) as kernel:
        done, wall, full = await decode_run(kernel, steps, sz)
        graphs = kernel.runner.graphs
        on_step = statistics.median(s.step_s for s in full) if full else None
        tokens = [list(d.token_ids) for d in done]
        off_step = off.get("median_step_s")
        return {"status": "measured", "mode": "captured" if mode is True else "eager (no CUDA: the same static "
                "batches, no capture)", "capture_error": graphs.error, "replays": graphs.replays,
                "static_steps": graphs.static_steps,
                "captured_buckets": sorted(graphs.graphs), "buckets": list(graphs.buckets),
                "on_median_step_s": on_step, "off_median_step_s": off_step,
                "off_over_on": off_step / on_step if on_step and off_step else None,
                "on_output_tok_per_s": sum(len(t) for t in tokens) / wall, "on_wall_s": wall,
                "full_decode_steps": len(full), "attention": kernel.runner.attention_backend or "torch",
                "same_attention_as_off": (kernel.runner.attention_backend or "torch") == off.get("attention"),
                "identical_greedy_outputs": (sum(a == b for a, b in zip(tokens, off_tokens)) if off_tokens else None),
                "requests": len(tokens)}


def transformers_decode(sz: dict, model_dir: str, dtype: Any, device: Any) -> dict:
    """The decode workload through transformers' continuous batching (`generate_batch`)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    gen = GenerationConfig(max_new_tokens=sz["decode"], do_sample=False, eos_token_id=None, pad_token_id=0)
    vocab = sz["model"]["vocab_size"]
    model.generate_batch(inputs=random_prompts(min(8, sz["concurrency"]), sz["prompt"], vocab, 1),
                         generation_config=GenerationConfig(max_new_tokens=4, do_sample=False, eos_token_id=None,
                                                            pad_token_id=0))
    prompts = random_prompts(sz["concurrency"], sz["prompt"], vocab, 2)
    sync(device)
    t0 = time.perf_counter()
    outs = model.generate_batch(inputs=prompts, generation_config=gen)
    sync(device)
    wall = time.perf_counter() - t0
    tokens = sum(len(o.generated_tokens) for o in outs.values())
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    # NOTE: the timed call includes generate_batch's own per-call set-up (its manager's start and, on CUDA,
    # graph warm-up), as a user of it pays; the warm-up call before it took compilation and allocation out.
    return {"concurrency": sz["concurrency"], "output_tokens": tokens, "wall_s": wall,
            "output_tok_per_s": tokens / wall, "includes_per_call_setup": True}


async def main(argv: list[str] | None = None) -> dict:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="the JSON file to write")
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes on CPU: checks the script, measures nothing")
    ap.add_argument("--device", default=None, help="default: cuda when present (cpu under --dry-run)")
    ap.add_argument("--skip", default="", help="comma-separated figure names not to run")
    args = ap.parse_args(argv)
    args.device = args.device or ("cpu" if args.dry_run or not torch.cuda.is_available() else "cuda")
    device = torch.device(args.device)
    if device.type == "cpu":   # the Triton candidate runs in its interpreter (read when the kernel is decorated)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    sz = DRY if args.dry_run else FULL
    skip = set(filter(None, args.skip.split(",")))
    # bf16 is the GPU's format; on CPU the dry run stays in fp32 (exact, and fast without AMX)
    dtype_name = "bfloat16" if device.type == "cuda" else "float32"
    out: dict[str, Any] = {"dry_run": args.dry_run, "device": {
        "type": device.type, "name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__}}

    def save() -> None:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1, default=str)

    with tempfile.TemporaryDirectory() as scratch:
        t0 = time.perf_counter()
        model_dir, params, weight_bytes = build_model_dir(sz["model"], getattr(torch, dtype_name), device,
                                                          os.path.join(scratch, "llama"))
        out["model"] = {"parameters": params, "weight_bytes": weight_bytes, "dtype": dtype_name,
                        "build_s": time.perf_counter() - t0, **sz["model"]}
        save()
        out["bandwidth"] = measure_bandwidth(device, sz["copy_bytes"])
        save()
        bw = out["bandwidth"]["bytes_per_s"]
        try:
            out["attention"] = attention_figure(sz, device, dtype_name, bw)
        except Exception as e:  # noqa: BLE001
            out["attention"] = {"error": repr(e), "trace": traceback.format_exc()[-2000:], "chosen": "torch"}
        save()
        # the measured choice: "triton" (the default on CUDA) or "torch" (the runner's non-Triton path)
        runner_cfg = {"attention": out["attention"]["chosen"]}
        off_tokens = await modelcall_figures(args, sz, model_dir, weight_bytes, dtype_name, bw, out, runner_cfg)
        save()
        if "graphs" in skip:
            out["cuda_graphs"] = {"status": "skipped"}
        else:
            try:
                out["cuda_graphs"] = await graphs_figure(args, sz, model_dir, dtype_name, runner_cfg,
                                                         out.get("decode", {}), off_tokens)
            except Exception as e:  # noqa: BLE001
                out["cuda_graphs"] = {"error": repr(e), "trace": traceback.format_exc()[-2000:]}
        save()
        if "transformers" in skip:
            out["transformers_decode"] = {"status": "skipped"}
        else:
            try:
                out["transformers_decode"] = transformers_decode(sz, model_dir, getattr(torch, dtype_name), device)
                mine = out.get("decode", {}).get("output_tok_per_s")
                if mine:
                    out["transformers_decode"]["modelcall_over_transformers"] = mine / out["transformers_decode"]["output_tok_per_s"]
                    out["transformers_decode"]["target_ratio"] = 5.0
            except Exception as e:  # noqa: BLE001
                out["transformers_decode"] = {"error": repr(e), "trace": traceback.format_exc()[-2000:]}
        save()
        for name, dt in (("parity_fp32", "float32"), ("parity_bf16", "bfloat16")):
            try:
                out[name] = await parity(sz, device, dt, scratch)
            except Exception as e:  # noqa: BLE001
                out[name] = {"error": repr(e), "trace": traceback.format_exc()[-2000:]}
            save()
    missing = [k for k in FIGURE_KEYS if k not in out]
    assert not missing, missing
    return out


def summary(out: dict) -> str:
    d, t, b = out.get("decode", {}), out.get("transformers_decode", {}), out.get("bandwidth", {})
    m = out.get("model", {})
    a = out.get("attention", {})
    att = {case: {k: (v.get("median_s"), v.get("ok")) for k, v in a.get(case, {}).items() if isinstance(v, dict)}
           for case in ("decode", "prefill")}
    lines = [f"device {out['device']['name']}  model {m.get('parameters', 0) / 1e9:.3f}B {m.get('dtype')}",
             f"copy bandwidth {b.get('bytes_per_s', 0) / 1e12:.3f} TB/s",
             f"attention chosen {a.get('chosen')} (median s, ok): {att}",
             f"decode @{d.get('concurrency')}: {d.get('output_tok_per_s')} tok/s, step {d.get('median_step_s')} s, "
             f"fraction of bandwidth {d.get('fraction_of_bandwidth')} (target 0.60)",
             f"transformers generate_batch: {t.get('output_tok_per_s')} tok/s, ratio {t.get('modelcall_over_transformers')}"
             f" (target 5)",
             f"ttft: {out.get('ttft')}", f"cuda graphs: {out.get('cuda_graphs')}",
             f"parity fp32: {out.get('parity_fp32')}", f"parity bf16: {out.get('parity_bf16')}"]
    return "\n".join(lines)


if __name__ == "__main__":
    import anyio
    result = anyio.run(main, sys.argv[1:])
    print(summary(result))
