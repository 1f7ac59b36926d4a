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
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import traceback
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
from modelcall.core import hookimpl  # noqa: E402
from modelcall.events import StepDone  # noqa: E402

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

# bf16 greedy parity: where the two greedy sequences first differ, the fp32 reference's logit of
# transformers' token minus that of modelcall's token must be at most this fraction of the reference's
# largest |logit| (a near-tie that bf16 rounding may flip); before that point the tokens are equal.
BF16_TIE_TOLERANCE = 2e-2
FIGURE_KEYS = ("device", "model", "bandwidth", "attention", "decode", "transformers_decode", "ttft", "cuda_graphs",
               "parity_fp32", "parity_bf16")
ATTENTION_TOL = {"float32": 1e-4, "bfloat16": 2e-2}   # |candidate - torch path in fp32|, outputs of size ~1


def sync(device: Any) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_model_dir(shape: dict, dtype: Any, device: Any, into: str, seed: int = 0) -> tuple[str, int, int]:
    """A random Llama built on `device`, saved to `into`; (dir, parameters, bytes of weights)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0, **shape)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype)
    params = sum(p.numel() for p in model.parameters())       # tied weights counted once
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    model.save_pretrained(into)
    save_word_tokenizer(into, shape["vocab_size"])
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return into, params, weight_bytes


def save_word_tokenizer(into: str, vocab: int) -> None:
    """One word per id ("t17"): the engine loads a tokenizer with every model; these prompts are ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", pad_token="t0", bos_token="t1",
                            eos_token="t2").save_pretrained(into)


def measure_bandwidth(device: Any, nbytes: int) -> dict:
    """A device-to-device copy, counting bytes read plus bytes written (median of 20 after 3 warm-ups)."""
    import torch

    src = torch.randn(nbytes // 4, device=device)      # random, never zeros (METHOD.md)
    dst = torch.empty_like(src)
    times = []
    for i in range(23):
        sync(device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            t = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            t = time.perf_counter() - t0
        if i >= 3:
            times.append(t)
    assert torch.equal(dst, src)
    t = statistics.median(times)
    return {"bytes_moved": 2 * src.numel() * 4, "median_s": t, "bytes_per_s": 2 * src.numel() * 4 / t}


class StepLog:
    """Observer plugin: every StepDone of the kernel it is handed to."""

    modelcall_plugin_name = "gpu-figures-steps"

    def __init__(self) -> None:
        self.steps: list[Any] = []

    @hookimpl
    def register_observers(self, register: Any) -> None:
        register(StepDone, self.steps.append, name=self.modelcall_plugin_name)


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(length)] for _ in range(n)]


async def complete_all(kernel: Any, prompts: list[list[int]], max_tokens: int) -> list[Any]:
    import anyio

    results: list[Any] = [None] * len(prompts)

    async def one(i: int) -> None:
        results[i] = await kernel.complete(prompt_token_ids=prompts[i], max_tokens=max_tokens, temperature=0,
                                           ignore_eos=True)

    async with anyio.create_task_group() as tg:
        for i in range(len(prompts)):
            tg.start_soon(one, i)
    return results


def kv_bytes_per_token(shape: dict, kv_elem: int) -> int:
    head_dim = shape["hidden_size"] // shape["num_attention_heads"]
    return shape["num_hidden_layers"] * 2 * shape["num_key_value_heads"] * head_dim * kv_elem


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


def reference_greedy(model: Any, prompt: list[int], n: int, device: Any) -> list[int]:
    import torch
    ids = torch.tensor([prompt], device=device)
    gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return gen[0, len(prompt):].tolist()


async def engine_greedy(model_dir: str, device: str, dtype_name: str, prompts: list[list[int]], n: int) -> list[list[int]]:
    from modelcall.core import Kernel, KernelConfig
    async with Kernel(KernelConfig(model=model_dir, device=device, dtype=dtype_name, kv_cache_memory_gb=0.25)) as kernel:
        done = await complete_all(kernel, prompts, n)
    return [list(d.token_ids) for d in done]


async def parity(sz: dict, device: Any, dtype_name: str, scratch: str) -> dict:
    """Greedy tokens of modelcall vs transformers' generate on the same device and dtype. fp32: exact.
    bf16: equal up to the first difference, and that difference a near-tie of the fp32 reference
    (BF16_TIE_TOLERANCE)."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, dtype_name)
    model_dir, _, _ = build_model_dir(sz["parity_model"], dtype, device, os.path.join(scratch, f"parity-{dtype_name}"))
    prompts = [random_prompts(1, 5 + 7 * i, sz["parity_model"]["vocab_size"], 100 + i)[0]
               for i in range(sz["parity_prompts"])]
    ours = await engine_greedy(model_dir, str(device), dtype_name, prompts, sz["parity_tokens"])
    ref_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    ref_model.generation_config.eos_token_id = None   # like ignore_eos: every sequence has parity_tokens
    theirs = [reference_greedy(ref_model, p, sz["parity_tokens"], device) for p in prompts]
    exact = sum(a == b for a, b in zip(ours, theirs))
    result: dict[str, Any] = {"prompts": len(prompts), "tokens_each": sz["parity_tokens"], "identical": exact}
    if dtype_name == "float32":
        result["pass"] = exact == len(prompts)
        return result
    fp32 = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    gaps = []
    for p, a, b in zip(prompts, ours, theirs):
        i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if i is None:
            continue
        with torch.inference_mode():
            logits = fp32(torch.tensor([p + a[:i]], device=device)).logits[0, -1].float()
        gaps.append(float((logits[b[i]] - logits[a[i]]) / logits.abs().max()))
    result.update(tolerance=BF16_TIE_TOLERANCE, divergences=len(gaps), max_relative_gap=max(gaps, default=0.0),
                  **{"pass": all(g <= BF16_TIE_TOLERANCE for g in gaps)})
    return result


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
