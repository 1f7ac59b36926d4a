"""Train the agent demo's LoRA adapter (issue 45): SmolLM2-135M-Instruct, the pretrained model modelcall serves by
default, taught the two demo tools by a PEFT LoRA on the corpus's varied chats, so `modelcall serve` of the GGUF file
plus the adapter answers the hand-written split through `modelcall agent`.

    python -m modelcall.plugins.demo_model.lora_train --base SmolLM2-135M-Instruct.Q4_1.gguf --out STAGE1 \\
        --extended 4000 --digit-weight 4 --threads 1
    python -m modelcall.plugins.demo_model.lora_train --base ... --out DIR --init STAGE1 --skip 200 --steps 100 \\
        --lr 4e-4 --extended 4000 --digit-weight 4 --threads 1

(the committed adapter, `agent_lora/`, is the second stage: 100 more steps over the rows the first did not reach,
both stages on the extended rules' chats, corpus.chats(extended=True), a digit weighing 4 in the loss).

Why a pretrained model and not the tiny one trained from scratch (`train.py`): the tiny model never saw a phrasing,
a number word or a city outside its generator, and a name it must copy is 4-7 pieces it loses its place in; a
pretrained model reads people's phrasings already and copies by attention (SmolLM2's tokenizer writes each digit as
one token). The adapter only has to teach the call format, when to call which tool and to copy the result.

The recipe: the base's GGUF weights dequantized to fp32 by transformers (`gguf_file=`; the Q4_1 values are what
the server multiplies, so the adapter is trained on the weights it is served with); chats from `corpus.chats`
(the generator kept apart from the evaluation split) without their `<think>` blocks, rendered with
`agent_lora/chat_template.jinja` (the template the demo is served with: a compact tools block, Hermes tags) and cut by
`rows.py` into pieces learnt or not: the loss is on the assistant turns only (the call, whose arguments copy the
question, and the answer, which copies the tool's result verbatim). Rows that share a system block share its
forward in a batch. The seed is fixed and torch's deterministic algorithms are on; that a rerun writes the same
bytes has not been checked (docs/demo-model.md).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import time
from typing import Any

from modelcall.plugins.demo_model import corpus, rows
from modelcall.plugins.demo_model.focus import POOL, focus_chats

HERE = os.path.dirname(os.path.abspath(__file__))
ADAPTER_DIR = os.path.join(HERE, "agent_lora")
TEMPLATE_FILE = os.path.join(ADAPTER_DIR, "chat_template.jinja")
RECORD = "modelcall_agent_lora.json"
SEED = 0
BASE_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
# r 8 on every projection of the top 15 of the 30 layers (1.2M parameters, 2.4 MB in bf16), alpha 16 (scale 2): the
# backward pass stops at layer 15, which with bf16 autocast makes a step 2.2x cheaper than fp32 on all layers
# (batch 8 of 90 tokens after a 120-token system block, one thread: 3.3 s of CPU against 7.4 s)
LORA = dict(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                "down_proj"], layers_to_transform=list(range(15, 30)))
# chats: a prefix of corpus.chats(20000, seed 0), the set the apartness test checks
TRAIN = dict(chats=4000, steps=200, batch=8, lr=1e-3, warmup=20, autocast="bfloat16")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def load_tokenizer(base: str) -> Any:
    """transformers' tokenizer of the GGUF file `base`, with the demo's chat template (the server's ids: a test
    holds the two to each other)."""
    from transformers import AutoTokenizer
    d, f = os.path.split(os.path.abspath(base))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    with open(TEMPLATE_FILE, encoding="utf-8") as fh:
        tok.chat_template = fh.read()
    return tok


def load_base(base: str) -> tuple[Any, Any]:
    """(tokenizer with the demo's chat template, fp32 model) from a GGUF file, as transformers dequantizes it."""
    from transformers import AutoModelForCausalLM
    d, f = os.path.split(os.path.abspath(base))
    tok = load_tokenizer(base)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype="float32")
    model.hf_quantizer = None   # a plain fp32 model from here (PEFT and save_pretrained look for it)
    return tok, model


def training_chats(n: int, seed: int, focus: int = 0, extended: int = 0) -> list[dict[str, Any]]:
    """The corpus's chats without reasoning: the adapter calls at once (shorter rows, and SmolLM2 has no think
    parser in the served template). With `focus`, that many chats past the first `n`, weighted to the weak spots
    (focus.py) instead; with `extended`, that many chats of the corpus with its extended paraphrase rules."""
    out = []
    source = (focus_chats(focus, n, seed) if focus else corpus.chats(extended, seed=seed, extended=True) if extended
              else corpus.chats(n, seed=seed))
    for chat in source:
        msgs = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in chat["messages"]]
        out.append({"tools": chat["tools"], "messages": msgs})
    return out


def _loss(model: Any, system: list[int], batch: list[tuple[list[int], list[bool]]], pad: int,
          digits: Any = None, digit_weight: float = 1.0) -> Any:
    """Mean cross-entropy over the learnt tokens, a digit token (`digits`: their ids) weighing `digit_weight` times
    the rest; the shared system block is run once for the batch."""
    import torch
    from transformers import DynamicCache

    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    attn = torch.zeros((len(batch), len(system) + width), dtype=torch.long)
    attn[:, :len(system)] = 1
    for i, (row, mask) in enumerate(batch):
        ids[i, :len(row)] = torch.tensor(row)
        attn[i, len(system):len(system) + len(row)] = 1
        for j in range(len(row) - 1):
            if mask[j + 1]:
                labels[i, j] = row[j + 1]
    inner = model.get_base_model().model
    shared = None
    if system:
        prefix = inner(input_ids=torch.tensor([system]), use_cache=True).past_key_values
        shared = DynamicCache(ddp_cache_data=[
            (layer.keys.expand(len(batch), -1, -1, -1), layer.values.expand(len(batch), -1, -1, -1))
            for layer in prefix.layers])
    pos = torch.arange(len(system), len(system) + width).unsqueeze(0).expand(len(batch), -1)
    hidden = inner(input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=shared,
                   use_cache=shared is not None).last_hidden_state
    learnt = labels != -100
    # logits only where a token is learnt: the 49k-row head is a large part of the step
    logits = model.get_base_model().lm_head(hidden[learnt])
    if digit_weight == 1.0:
        return torch.nn.functional.cross_entropy(logits.float(), labels[learnt])
    # the call's numbers and the copied result are a few tokens among many a stage already predicts: weigh them up
    target = labels[learnt]
    weight = 1.0 + (digit_weight - 1.0) * torch.isin(target, digits).float()
    ce = torch.nn.functional.cross_entropy(logits.float(), target, reduction="none")
    return (ce * weight).sum() / weight.sum()


def train(base: str, out_dir: str, *, threads: int = 1, steps: int | None = None, init: str | None = None,
          skip: int = 0, lr: float | None = None, focus: int = 0, extended: int = 0, digit_weight: float = 1.0,
          log: Any = print) -> dict[str, Any]:
    """Train an adapter into `out_dir`; `init` continues from an adapter directory, past the first `skip` batches
    of the same seeded order (the rows it was trained on), at `lr`; `focus` trains on that many weak-spot chats
    (focus.py), `extended` on that many chats of the extended rules (corpus.chats), instead of the first
    TRAIN["chats"]; `digit_weight`: a digit token's weight in the loss."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.set_num_threads(threads)
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    t0, c0 = time.monotonic(), _cpu()
    load0 = os.getloadavg()
    steps = steps or TRAIN["steps"]
    tok, model = load_base(base)
    chats = training_chats(TRAIN["chats"], SEED, focus, extended)
    rows.check_fast_render(tok, chats[:50])
    groups = rows.tokenize_rows(tok, [r for c in chats for r in rows.examples(tok, c)])
    system_ids = {s: (tok(s, add_special_tokens=False).input_ids if s else []) for s in groups}
    log(f"rows {sum(len(g) for g in groups.values())} in {len(groups)} system blocks; prepared in "
        f"{time.monotonic() - t0:.0f}s")
    if init:
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, init, is_trainable=True)
        for p in model.parameters():
            if p.requires_grad:
                p.data = p.data.float()   # stored in bf16
    else:
        model = get_peft_model(model, LoraConfig(**LORA, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM"))
    params = [p for p in model.parameters() if p.requires_grad]
    lr = lr or TRAIN["lr"]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    warm = TRAIN["warmup"]
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))))
    rng = random.Random(SEED)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    digits = torch.tensor(tok.convert_tokens_to_ids(list("0123456789")))
    order: list[tuple[str, list]] = []
    for _ in range(skip):
        if not order:
            order = rows.batches(groups, TRAIN["batch"], rng)
        order.pop()
    model.train()
    t_train, c_train = time.monotonic(), _cpu()
    for step in range(steps):
        if not order:
            order = rows.batches(groups, TRAIN["batch"], rng)
        system, batch = order.pop()
        with torch.autocast("cpu", dtype=getattr(torch, TRAIN["autocast"])):
            loss = _loss(model, system_ids[system], batch, pad, digits, digit_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if step % 10 == 0 or step == steps - 1:
            log(f"step {step}/{steps} loss {loss.item():.4f} {time.monotonic() - t_train:.0f}s wall "
                f"{_cpu() - c_train:.0f}s cpu load {os.getloadavg()[0]:.1f}")
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    _to_bf16(os.path.join(out_dir, "adapter_model.safetensors"))
    _tidy(out_dir)
    record = {"base": os.path.basename(base), "seed": SEED, "lora": LORA, "train": {**TRAIN, "steps": steps, "lr": lr},
              "continued": {"from": os.path.basename(os.path.normpath(init)), "skip": skip} if init else None,
              "focus": {"chats": focus, "start": TRAIN["chats"], "pool": POOL} if focus else None,
              "extended": {"chats": extended, "seed": SEED} if extended else None,
              "digit_weight": digit_weight,
              "threads": threads, "rows": sum(len(g) for g in groups.values()),
              "train_wall_s": round(time.monotonic() - t_train), "train_cpu_s": round(_cpu() - c_train),
              "total_wall_s": round(time.monotonic() - t0), "total_cpu_s": round(_cpu() - c0),
              "load_avg_start": [round(x, 1) for x in load0], "load_avg_end": [round(x, 1) for x in os.getloadavg()]}
    with open(os.path.join(out_dir, RECORD), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    log(json.dumps(record))
    return record


def _to_bf16(path: str) -> None:
    # the adapter in bf16: half the bytes in the repository; the server computes its deltas in fp32 either way
    import torch
    from safetensors.torch import load_file, save_file
    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in load_file(path).items()}
    save_file(tensors, path, metadata={"format": "pt"})


def _tidy(out_dir: str) -> None:
    # the base named by its hub id, not this machine's cache path; PEFT's model card template is not kept
    path = os.path.join(out_dir, "adapter_config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    config["base_model_name_or_path"] = BASE_ID
    config["target_modules"] = sorted(config["target_modules"])   # PEFT writes a set, in no fixed order
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    card = os.path.join(out_dir, "README.md")
    if os.path.exists(card):
        os.remove(card)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="SmolLM2-135M-Instruct's GGUF file (modelcall fetch-model smollm2)")
    p.add_argument("--out", required=True, help="the adapter directory to write")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, help=f"optimizer steps (default {TRAIN['steps']})")
    p.add_argument("--init", help="continue from this adapter directory")
    p.add_argument("--skip", type=int, default=0, help="batches of the seeded order to pass over (those --init saw)")
    p.add_argument("--lr", type=float, help=f"peak learning rate (default {TRAIN['lr']})")
    p.add_argument("--focus", type=int, default=0, help="train on this many weak-spot chats past the first set")
    p.add_argument("--extended", type=int, default=0, help="train on this many chats of the extended rules")
    p.add_argument("--digit-weight", type=float, default=1.0, help="a digit token's weight in the loss")
    a = p.parse_args(argv)
    train(a.base, a.out, threads=a.threads, steps=a.steps, init=a.init, skip=a.skip, lr=a.lr, focus=a.focus,
          extended=a.extended, digit_weight=a.digit_weight)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
