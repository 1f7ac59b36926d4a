"""Speculative decoding against speculation off, in one run: three workloads, output tokens per wall second.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/speculative.py [--rounds 3] [--k 8] [--threads 1]
        [--workloads retry,code-edit,w1,w1ref] [--async-scheduling on|off]

- retry:     agents that retry: each of 8 prompts sent, then sent again 3 times (random demo model,
             suffix decoding: the retries are proposed the earlier output).
- code-edit: the output repeats the prompt (an edit that keeps most of the file). Random weights never
             copy, so the benchmark first trains a tiny copying model (the demo model's shape, a copy
             task: x1..xn SEP -> x1..xn, a minute or so on CPU) and runs prompt lookup (ngram) on it.
- w1:        nothing repeats: 16 requests of random prompt ids on the random demo model, ngram on.
- w1ref:     the project's W1 (../shared/bench/make_reference_model.py --size w1, built into a temp dir:
             58.5M parameters, bf16, 32 requests of 128 prompt ids of argparse.py, 128 new tokens),
             ngram on. Its random weights do repeat themselves (greedy output falls into loops), so
             prompt lookup finds real hits there: this is not a "nothing repeats" workload.

Greedy, end-of-sequence ignored, all requests of a round submitted at once. One kernel runs every
round, with its speculator (on) or without it (off: scheduler and engine hold none, the code path of a
kernel without speculative_config; --two-kernels builds a second kernel for off instead). On and off
rounds alternate (off, on, on, off, off, on, ...) so machine noise hits both; the figure is the ratio of the
medians (wall throughput), and of process CPU time per output token (higher is better for on; far
less sensitive to other load on a shared machine). Outputs of on and off are compared token for token (greedy parity).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

from modelcall.core import Kernel, SamplingParams

os.environ.setdefault("MODELCALL_DEMO_MODEL", "random")

REPO = Path(__file__).resolve().parent.parent
SEP = 9          # the copy task's separator id (ids 0..8 are the demo tokenizer's special tokens)
COPY_LEN = 48    # tokens to copy
COPY_VOCAB = range(10, 266)


def train_copy_model(out: Path, steps: int, seed: int = 0) -> Path:
    """A 2-layer Llama of the demo model's shape trained to repeat x1..xn after SEP (a fixed offset:
    RoPE attention learns it quickly). The demo model's tokenizer files are copied next to it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from modelcall.plugins.demo_model import demo_model_dir

    src = Path(demo_model_dir())
    cfg_json = json.loads((src / "config.json").read_text())
    cfg_json["initializer_range"] = 0.02
    torch.manual_seed(seed)
    config = LlamaConfig(**{k: v for k, v in cfg_json.items() if k not in ("architectures", "transformers_version")})
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    lo, hi = COPY_VOCAB.start, COPY_VOCAB.stop
    n = COPY_LEN
    t0 = time.perf_counter()
    for step in range(steps):
        x = torch.randint(lo, hi, (32, n))
        seq = torch.cat([x, torch.full((32, 1), SEP), x], 1)
        logits = model(input_ids=seq[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits[:, n:].reshape(-1, logits.shape[-1]), seq[:, n + 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(f"  copy model step {step} loss {loss.item():.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in os.listdir(src):
        if name.startswith("tokenizer") or name.endswith(".jinja"):
            shutil.copyfile(src / name, out / name)
    return out


def build_reference_model(out: Path) -> tuple[Path, Path]:
    """The project's W1 model and workload (../shared/bench/make_reference_model.py, same bytes every time)."""
    script = Path(os.environ.get("SHARED_DIR", REPO.parent / "shared")) / "bench" / "make_reference_model.py"
    subprocess.run([sys.executable, str(script), str(out), "--size", "w1"], check=True, capture_output=True)
    return out / "model", out / "w1.jsonl"


async def run_round(kernel: Kernel, waves: list[list[list[int]]], max_tokens: int) -> tuple[float, list, float]:
    """Output tokens per wall second over `waves` (each wave's requests at once, waves in order), the
    outputs, and process CPU microseconds per output token (less sensitive to other load)."""
    kernel.kv.reset_prefix_cache()
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outs: list = []
    tokens = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for wave in waves:
        got: dict[int, list[int]] = {}

        async def one(i: int, ids: list[int]) -> None:
            done = await kernel.complete(prompt_token_ids=ids, params=params)
            got[i] = done.token_ids

        async with anyio.create_task_group() as tg:
            for i, ids in enumerate(wave):
                tg.start_soon(one, i, ids)
        outs.extend(got[i] for i in range(len(wave)))
        tokens += sum(len(v) for v in got.values())
    return tokens / (time.perf_counter() - t0), outs, 1e6 * (time.process_time() - c0) / tokens


class Toggled:
    """One kernel with speculation configured, run with it (on) or without it (off: the scheduler and the
    engine hold no speculator, exactly the code path of a kernel without speculative_config). Same weights,
    same memory for both: two kernels of one model differ by up to ~4% in an A/A run here."""

    def __init__(self, kernel: Kernel, speculator) -> None:
        self.kernel, self.speculator, self.steps = kernel, speculator, {"off": 0, "on": 0}

    async def round(self, mode: str, waves, max_tokens: int) -> tuple[float, list, float]:
        sp = self.speculator if mode == "on" else None
        self.kernel.scheduler.speculator = self.kernel.engine.speculator = sp
        s0 = self.kernel.engine.step_count
        got = await run_round(self.kernel, waves, max_tokens)
        self.steps[mode] += self.kernel.engine.step_count - s0
        return got


async def compare(name: str, common: dict, spec: dict, waves, max_tokens: int, rounds: int,
                  two_kernels: bool = False) -> dict:
    rates: dict[str, list[float]] = {"off": [], "on": []}
    cpus: dict[str, list[float]] = {"off": [], "on": []}
    same = True
    async with contextlib.AsyncExitStack() as stack:
        on = await stack.enter_async_context(Kernel(speculative_config=spec, **common))
        off = await stack.enter_async_context(Kernel(**common)) if two_kernels else on
        for k in (off, on):
            while not k.ready:
                await anyio.sleep(0.01)
        sp = on.speculator
        runs = {"on": Toggled(on, sp), "off": Toggled(off, None)}
        await runs["off"].round("off", waves[:1], 8)   # warm-up
        await runs["on"].round("on", waves[:1], 8)
        runs["off"].steps = {"off": 0, "on": 0}
        runs["on"].steps = {"off": 0, "on": 0}
        s0 = (sp.num_draft_tokens, sp.num_accepted_tokens, sp.num_proposer_calls)
        for i in range(rounds):
            # NOTE: the order alternates (off-on, on-off, ...) so that whatever favours the first or the
            # second run of a pair hits both alike.
            outs = {}
            for mode in (("off", "on") if i % 2 == 0 else ("on", "off")):
                r, outs[mode], c = await runs[mode].round(mode, waves, max_tokens)
                rates[mode].append(r)
                cpus[mode].append(c)
            same = same and outs["off"] == outs["on"]
        drafted, accepted = sp.num_draft_tokens - s0[0], sp.num_accepted_tokens - s0[1]
        calls = sp.num_proposer_calls - s0[2]
        steps_off, steps_on = runs["off"].steps["off"], runs["on"].steps["on"]
    m_off, m_on = statistics.median(rates["off"]), statistics.median(rates["on"])
    row = {"workload": name, "spec": spec, "kernels": 2 if two_kernels else 1,
           "off_tok_s": round(m_off, 1), "on_tok_s": round(m_on, 1),
           "ratio": round(m_on / m_off, 3),
           "cpu_us_per_token_off": round(statistics.median(cpus["off"]), 1),
           "cpu_us_per_token_on": round(statistics.median(cpus["on"]), 1),
           "cpu_ratio": round(statistics.median(cpus["off"]) / statistics.median(cpus["on"]), 3),
           # the median of each adjacent off/on pair's own ratio (a pair shares the machine's load of the moment)
           "paired_ratio": round(statistics.median(b / a for a, b in zip(rates["off"], rates["on"])), 3),
           "paired_cpu_ratio": round(statistics.median(a / b for a, b in zip(cpus["off"], cpus["on"])), 3),
           "greedy_identical": same, "draft_tokens": drafted,
           "accepted_tokens": accepted, "acceptance": round(accepted / drafted, 3) if drafted else None,
           "proposer_calls": calls, "steps_off": steps_off, "steps_on": steps_on,
           "rounds_off": [round(x, 1) for x in rates["off"]], "rounds_on": [round(x, 1) for x in rates["on"]],
           "cpu_rounds_off": [round(x, 1) for x in cpus["off"]], "cpu_rounds_on": [round(x, 1) for x in cpus["on"]]}
    print(json.dumps(row), flush=True)
    return row


async def main(args: argparse.Namespace) -> None:
    from modelcall.plugins.demo_model import demo_model_dir

    rng = random.Random(0)
    k = args.k
    base = {"dtype": "float32", "threads": args.threads, "max_num_seqs": 64, "num_kv_blocks": 2048}
    if args.async_scheduling is not None:   # both kernels alike (default: the config's default)
        base["async_scheduling"] = args.async_scheduling == "on"
    base = {a: b for a, b in base.items() if b is not None}
    rows = []
    if "retry" in args.workloads:
        prompts = [[rng.randrange(10, 2048) for _ in range(rng.randrange(32, 96))] for _ in range(8)]
        waves = [prompts] * 4   # the first try, then 3 retries of each
        rows.append(await compare("retry", {"model": demo_model_dir(), **base},
                                  {"method": "suffix", "num_speculative_tokens": k}, waves, 96, args.rounds,
                                  args.two_kernels))
    if "code-edit" in args.workloads:
        model = train_copy_model(Path(tempfile.mkdtemp(prefix="modelcall-copy-")) / "model", args.train_steps)
        lo, hi = COPY_VOCAB.start, COPY_VOCAB.stop
        prompts = [[rng.randrange(lo, hi) for _ in range(COPY_LEN)] + [SEP] for _ in range(8)]
        rows.append(await compare("code-edit", {"model": str(model), **base},
                                  {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4,
                                   "prompt_lookup_min": 2}, [prompts], COPY_LEN, args.rounds, args.two_kernels))
    if "w1" in args.workloads:
        prompts = [[rng.randrange(10, 2048) for _ in range(128)] for _ in range(16)]
        rows.append(await compare("w1", {"model": demo_model_dir(), **base},
                                  {"method": "ngram", "num_speculative_tokens": k}, [prompts], 128, args.rounds,
                                  args.two_kernels))
    if "w1ref" in args.workloads:
        model, dataset = build_reference_model(Path(tempfile.mkdtemp(prefix="modelcall-w1ref-")))
        rows_w1 = [json.loads(line) for line in dataset.read_text().splitlines() if line.strip()]
        prompts = [r["prompt_token_ids"] for r in rows_w1]
        ref = {**base, "dtype": "auto"}   # the model's own bf16
        rows.append(await compare("w1ref", {"model": str(model), **ref},
                                  {"method": "ngram", "num_speculative_tokens": k}, [prompts],
                                  rows_w1[0]["max_tokens"], args.rounds, args.two_kernels))
    for r in rows:
        print(f"{r['workload']:10s} off {r['off_tok_s']:8.1f} tok/s  on {r['on_tok_s']:8.1f} tok/s  "
              f"x{r['ratio']:.3f}  (CPU per token: x{r['cpu_ratio']:.3f}; paired x{r['paired_ratio']:.3f} / "
              f"x{r['paired_cpu_ratio']:.3f})  acceptance {r['acceptance']}  identical {r['greedy_identical']}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--train-steps", type=int, default=200)
    p.add_argument("--workloads", default="retry,code-edit,w1,w1ref")
    p.add_argument("--two-kernels", action="store_true",
                   help="off and on as two kernels (default: one kernel, its speculator detached for off)")
    p.add_argument("--async-scheduling", choices=("on", "off"), default=None,
                   help="KernelConfig.async_scheduling of both kernels (default: the config's default)")
    anyio.run(main, p.parse_args())
