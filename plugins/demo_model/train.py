"""Train the demo model that answers (seeded, one CPU thread; docs/demo-model.md gives the CPU and wall
time of the committed model's run, the wall time depending on the load of the shared machine):

    python -m modelcall.plugins.demo_model.train --out plugins/demo_model/trained
    python -m modelcall.plugins.demo_model.train --check plugins/demo_model/trained   # accuracy only

What makes it learn in minutes:
- the prompts are the bytes `modelcall serve` renders for `modelcall agent` with the two demo tools
  (corpus.served_tools, corpus._call), so the served model sees what it was trained on;
- the tokenizer makes every number unit one token (each group of up to three digits, numbers split
  left to right: 3367 -> 336 7; each operator with its spaces, " * "; each Han character), and spells a
  Latin name with the same pieces wherever it stands (a space or a quote before a capitalized word is a
  piece of its own), so a city outside every list is copied piece by piece; with tied embeddings,
  copying a token is attending to it (its embedding is its own best logit), and no number unit repeats
  a neighbour the way single digits do (33 -> 3 3), which is what confuses copying;
- embeddings and attention start out ready to copy: every number token shares one direction (one "is a
  number" key to learn, not 1,100), and each layer's values and output start as a scaled identity
  (what a position attends to reaches the tied head as it is);
- a previous-token head (layer 0) and an induction head (layer 1) set up at the start
  (`_induction_heads`): copying a unit of several tokens (336 7, a result or a 4-digit dividend)
  is "what followed the token I just wrote", which trainer 2's model never learnt;
- the loss weighs the copied tokens (a learnt token that the row's prompt holds: the question's numbers
  and city pieces, the tool's result) four times the rest;
- the corpus (corpus.py, phrasing.py, places.py) varies the phrasing as people do and half its cities
  are made up, so the model cannot learn a list where it must learn to copy (issue 45);
- a warm-up on the tool chats without the system block (short rows, where the question holds a
  large share of the attention) before the real rows with it;
- every tool chat offers the same tools, so the long system block (the tools' JSON) runs once per
  batch and its keys and values are shared by the batch's rows.

Deterministic: a fixed seed, one thread, deterministic torch ops: a rerun writes the same weights.
The output directory holds the model, the tokenizer with the demo chat template and
`modelcall_demo.json`: the seed, the steps, the training time, and the accuracy on held-out questions
and on the hand-written split (evalset.py; greedy, through the chat template, the tool run between the
turns as the agent runs it). `--steps`, `--bare-steps` and `--layers` change a run (pilots; recorded).
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

from modelcall.plugins.demo_model import corpus
from modelcall.plugins.demo_model.measure import measure, measure_eval
from modelcall.plugins.demo_model.rows import batches, check_fast_render, examples, fast_render, tokenize_rows
from modelcall.plugins.demo_model.vocab import MAX_POSITIONS, build_tokenizer

TRAINER_VERSION = "4"
SEED = 0
MODEL = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=4, head_dim=32, max_position_embeddings=MAX_POSITIONS,
             tie_word_embeddings=True, rope_theta=10000.0)
# the scales of the induction init (_induction_heads): previous-token and match sharpness
INDUCTION = dict(prev=2.5, match=5.0, copy=0.0, shared=0.5, write=0.03)
# bare: the tool chats without their system block (warm-up); chats: every row as served
TRAIN = dict(chats=20000, bare_steps=300, steps=1500, batch=32, lr=4e-3, warmup=30, weight_decay=0.01,
             copy_weight=4.0, induction=True)


# ---- training -----------------------------------------------------------------------------------

def train(out_dir: str, *, threads: int = 1, log: Any = print) -> dict[str, Any]:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)
    t0, cpu0 = time.monotonic(), _cpu()
    chats = list(corpus.chats(TRAIN["chats"], seed=SEED))
    tok = build_tokenizer([fast_render(_plain_tok(), c["messages"], c["tools"]) for c in chats[:4000]])
    check_fast_render(tok, chats[:40] + [{**c, "tools": None} for c in chats[:20]])
    groups = tokenize_rows(tok, [r for c in chats for r in examples(tok, c)])
    system_ids = {s: tok(s, add_special_tokens=False).input_ids for s in groups}
    log(f"corpus: {len(chats)} chats, {sum(map(len, groups.values()))} rows, {len(groups)} system blocks "
        f"({max(len(v) for v in system_ids.values())} tokens at most), vocab {len(tok)}, "
        f"{time.monotonic() - t0:.1f}s")

    eos = [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    cfg = LlamaConfig(vocab_size=len(tok), eos_token_id=eos[0], pad_token_id=eos[1], bos_token_id=None,
                      torch_dtype="float32", **MODEL)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    log(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")
    _kin_embeddings(model, tok, torch)
    _copying_values(model, torch)
    if TRAIN["induction"]:
        _induction_heads(model, torch)
    _SKELETON[:] = [torch.tensor(_skeleton_ids(tok))]
    probe = _probe_rows(tok)
    if TRAIN["bare_steps"]:
        # The tool chats without the system block first: at the start attention is spread evenly, and
        # over 217 tokens of tools' JSON the question's few tokens get almost none of it; short rows
        # learn to look at the question (and cost a third as much a step).
        bare = tokenize_rows(tok, [r for c in chats if c["tools"] for r in examples(tok, {**c, "tools": None})])
        system_ids.update({s: tok(s, add_special_tokens=False).input_ids for s in bare})
        _run_phase(model, bare, system_ids, TRAIN["bare_steps"], TRAIN["batch"], TRAIN["lr"],
                   random.Random(SEED + 2), eos[1], log, t0, "bare", probe)
    _run_phase(model, groups, system_ids, TRAIN["steps"], TRAIN["batch"], TRAIN["lr"],
               random.Random(SEED + 1), eos[1], log, t0, "chats", probe)
    train_s, train_cpu = time.monotonic() - t0, _cpu() - cpu0
    model.eval()
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=eos[1], bos_token_id=None)
    os.makedirs(out_dir, exist_ok=True)
    tok.save_pretrained(out_dir)
    model.save_pretrained(out_dir)
    t1 = time.monotonic()
    accuracy = measure(out_dir, threads=threads)
    eval_split = measure_eval(out_dir, threads=threads)
    meta = {"trainer_version": TRAINER_VERSION, "seed": SEED, "model": MODEL, "train": TRAIN,
            "parameters": sum(p.numel() for p in model.parameters()), "torch": torch.__version__,
            "train_wall_seconds": round(train_s), "train_cpu_seconds": round(train_cpu),
            "measure_wall_seconds": round(time.monotonic() - t1), "accuracy": accuracy, "eval_split": eval_split}
    with open(os.path.join(out_dir, "modelcall_demo.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")
    return meta


def _kin_embeddings(model: Any, tok: Any, torch: Any) -> None:
    """Start every number token with one shared direction and every operator with another (plus its own
    random part): attending to "the number in the question" is then one direction to learn, not 1,100;
    the random parts, through the tied head, still name the token copied."""
    emb = model.get_input_embeddings().weight
    gen = torch.Generator().manual_seed(SEED)
    kinds = [[f"{i}" for i in range(1000)] + [f"{i:02d}" for i in range(10)] + [f"{i:03d}" for i in range(100)],
             [" * ", " + ", " - ", " / ", " = "]]
    with torch.no_grad():
        for units in kinds:
            ids = sorted({i for (i,) in tok(units, add_special_tokens=False).input_ids})
            shared = torch.randn(emb.shape[1], generator=gen) * float(emb[ids].std())
            emb[ids] = 0.7 * emb[ids] + shared


def _copying_values(model: Any, torch: Any) -> None:
    """Each layer's values and output start as a scaled identity (the four heads' value slices tile the
    hidden size): whatever a position attends to is added to it as it is, so once attention finds the
    city or the number, the tied head already names it. The attention pattern is still learnt."""
    scale = float(model.config.initializer_range)
    with torch.no_grad():
        for layer in model.model.layers:
            attn = layer.self_attn
            attn.v_proj.weight.copy_(torch.eye(*attn.v_proj.weight.shape))
            attn.o_proj.weight.copy_(torch.eye(*attn.o_proj.weight.shape) * scale)


def _skeleton_ids(tok: Any) -> list[int]:
    """The template's own tokens (role markers, tags, newlines): in every prompt, so never "copied"."""
    text = "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n<tool_call>\n</tool_call><tool_response>\n</tool_response>"
    return sorted(set(tok(text, add_special_tokens=False).input_ids))


def _induction_heads(model: Any, torch: Any) -> None:
    """Start layer 0's head 0 as a previous-token head and layer 1's head 0 as an induction head, so
    that copying a unit of several tokens (3367 -> 336 7: a 4-digit dividend into the call, the
    tool's reply into the answer) has its mechanism ready: after copying 336 the model can attend to
    the token that followed 336 in the prompt. Trainer 2's model (no such init) lost the second
    group of every two-group result at 1,800 steps and at 3,000.

    How, in a plain Llama (no new parts, so every runner serves it):
    - every embedding gets the same norm, one shared direction `u` (a constant logit shift under the
      tied head) and zeros in the last `M` dims, kept for "the previous token"; dims 0..M-1 lose their
      shared kind direction (the match below compares them, kinds would blur it);
    - layer 0 head 0 reads only `u`, so its query and key are the same at every position, and its
      key is the query turned by one step of the fastest rotary frequencies: the score peaks at the
      previous position; its value (identity init) of dims 0..M-1 is written to the last M dims;
    - layer 1 head 0 matches the current token's dims 0..M-1 against the previous-token dims on the
      slowest rotary pairs (nearly position-free over a chat's length); its value (the token found)
      goes back to dims 0-31, which the tied head reads, scaled by INDUCTION["copy"].
    NOTE: copy=0: the head's output starts at zero and training turns it on where it helps. 900-step
    runs: copy 0.1 (with answers stating only the result) gave 0/40 held out, the call's first
    number a constant; copy 0 (answers as now) 18/40; trainer 2 9/40."""
    cfg = model.config
    hidden, hd = cfg.hidden_size, cfg.head_dim
    half = hd // 2
    slow = list(range(half - 9, half)) + list(range(hd - 9, hd))   # 9 slowest pairs, 18 dims
    m = len(slow)
    prev = slice(hidden - m, hidden)
    emb = model.get_input_embeddings().weight
    gen = torch.Generator().manual_seed(SEED + 3)
    inv_freq = model.model.rotary_emb.inv_freq.float()
    with torch.no_grad():
        std = float(emb[:, m: hidden - m].std())
        emb[:, :m] = torch.randn(emb.shape[0], m, generator=gen) * std
        emb[:, prev] = 0
        u = torch.zeros(hidden)
        u[m: hidden - m] = torch.randn(hidden - 2 * m, generator=gen)
        u /= u.norm()
        # every embedding the same norm with the same share of `u`: after RMSNorm every position's
        # component along `u` is then exactly the same at layer 0 (a previous-token score that varied
        # with the token would pick the wrong neighbour)
        norm = float(emb.norm(dim=1).median())
        emb -= torch.outer(emb @ u, u)
        emb *= norm / emb.norm(dim=1, keepdim=True)
        emb += INDUCTION["shared"] * norm * u
        # layer 0, head 0: previous-token attention from the constant part of every position
        a0 = INDUCTION["prev"]
        q0, k0 = torch.zeros(hd), torch.zeros(hd)
        fast = slice(0, 4)  # the fastest rotary pairs only: the slow ones score all near positions alike
        q0[fast] = 1.0
        k0[fast], k0[half:][fast] = torch.cos(inv_freq[fast]), torch.sin(inv_freq[fast])
        attn0 = model.model.layers[0].self_attn
        attn0.q_proj.weight[:hd] = a0 * torch.outer(q0, u)
        attn0.k_proj.weight[:hd] = a0 * torch.outer(k0, u)
        o0 = attn0.o_proj.weight
        o0[:, :hd] = 0
        o0[prev, :m] = torch.eye(m) * INDUCTION["write"]
        # layer 1, head 0: the current token against the previous-token dims
        attn1 = model.model.layers[1].self_attn
        a1 = INDUCTION["match"]
        wq, wk = torch.zeros(hd, hidden), torch.zeros(hd, hidden)
        for d, row in enumerate(slow):
            wq[row, d] = a1
            wk[row, hidden - m + d] = a1
        attn1.q_proj.weight[:hd] = wq
        attn1.k_proj.weight[:hd] = wk
        o1 = attn1.o_proj.weight
        o1[:, :hd] = 0
        o1[:hd, :hd] = torch.eye(hd) * INDUCTION["copy"]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


_PLAIN: list[Any] = []


def _plain_tok():
    """A tokenizer with the demo template only, to render the tokenizer's training text."""
    if not _PLAIN:
        from tokenizers import Tokenizer, models
        from transformers import PreTrainedTokenizerFast
        from modelcall.plugins.demo_model.template import CHAT_TEMPLATE
        t = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()))
        t.chat_template = CHAT_TEMPLATE
        _PLAIN.append(t)
    return _PLAIN[0]


def _run_phase(model: Any, groups: dict[str, list], system_ids: dict[str, list[int]], steps: int, size: int,
               lr: float, rng: random.Random, pad: int, log: Any, t0: float, kind: str, probe: Any) -> None:
    import torch

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": TRAIN["weight_decay"]},
                             {"params": other, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.98))
    warmup = TRAIN["warmup"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) *
                                              (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))))
    order: list[tuple[str, list]] = []
    model.train()
    for step in range(steps):
        if not order:
            order = batches(groups, size, rng)
        system, batch = order.pop()
        loss = _loss(model, system_ids[system], batch, pad)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            extra = ""
            if probe is not None and (step % 100 == 0 or step == steps - 1):
                extra = " probe " + _probe_score(model, probe, system_ids, pad)
                model.train()
            log(f"{kind} step {step}/{steps} loss {loss.item():.4f} {time.monotonic() - t0:.0f}s{extra}")


def _hidden(model: Any, system: list[int], batch: list[tuple[list[int], list[bool]]], pad: int) -> tuple[Any, Any, Any]:
    import torch
    from transformers import DynamicCache

    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    attn = torch.zeros((len(batch), len(system) + width), dtype=torch.long)
    attn[:, :len(system)] = 1
    copied = torch.zeros((len(batch), width), dtype=torch.bool)
    skeleton = set(_SKELETON[0].tolist()) if _SKELETON else set()
    for i, (row, mask) in enumerate(batch):
        ids[i, :len(row)] = torch.tensor(row)
        attn[i, len(system):len(system) + len(row)] = 1
        given = {t for t, learn in zip(row, mask) if not learn} - skeleton
        # label of position j is the token at j+1 when that token is learnt; copied when the prompt holds it
        for j in range(len(row) - 1):
            if mask[j + 1]:
                labels[i, j] = row[j + 1]
                copied[i, j] = row[j + 1] in given
    shared = None
    if system:
        prefix = model.model(input_ids=torch.tensor([system]), use_cache=True).past_key_values
        shared = DynamicCache(ddp_cache_data=[
            (layer.keys.expand(len(batch), -1, -1, -1), layer.values.expand(len(batch), -1, -1, -1))
            for layer in prefix.layers])
    pos = torch.arange(len(system), len(system) + width).unsqueeze(0).expand(len(batch), -1)
    hidden = model.model(input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=shared,
                         use_cache=shared is not None).last_hidden_state
    return hidden, labels, copied


_SKELETON: list[Any] = []  # the template's token ids (a tensor), set by train()


def _loss(model: Any, system: list[int], batch: list[tuple[list[int], list[bool]]], pad: int) -> Any:
    import torch
    hidden, labels, copied = _hidden(model, system, batch, pad)
    # NOTE: logits only where a token is learnt (under half the positions): the head is a large part
    # of a step in a model this small.
    learnt = labels != -100
    target = labels[learnt]
    losses = torch.nn.functional.cross_entropy(model.lm_head(hidden[learnt]), target, reduction="none")
    # the copied tokens (call arguments, the result and the city in the answer) weigh more: the
    # boilerplate around them is learnt in a few hundred steps, the copies are what is left
    weight = 1.0 + (TRAIN["copy_weight"] - 1.0) * copied[learnt].float()
    return (losses * weight).sum() / weight.sum()


def _probe_rows(tok: Any) -> dict[str, list]:
    """Held-out rows (arithmetic and weather) to watch training: teacher-forced, so one forward."""
    rng = random.Random(5)
    chats = [corpus.arithmetic_chat(rng, e, "en" if i % 2 else "zh") for i, e in enumerate(corpus.held_out()[20:36])]
    chats += [corpus.weather_chat(rng, c, "en" if i % 2 else "zh") for i, c in enumerate(corpus.CITIES[::3])]
    return tokenize_rows(tok, [r for c in chats for r in examples(tok, c)])


def _probe_score(model: Any, probe: dict[str, list], system_ids: dict[str, list[int]], pad: int) -> str:
    import torch
    model.eval()
    tokens = right = rows = whole = 0
    with torch.no_grad():
        for system, batch in probe.items():
            hidden, labels, _ = _hidden(model, system_ids.get(system) or [], batch, pad)
            got = model.lm_head(hidden).argmax(-1)
            ok = (got == labels) | (labels == -100)
            tokens += int((labels != -100).sum())
            right += int(((got == labels) & (labels != -100)).sum())
            rows += len(batch)
            whole += int(ok.all(-1).sum())
    return f"tokens {right}/{tokens} rows {whole}/{rows}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write the trained model here")
    p.add_argument("--check", metavar="DIR", help="measure a trained model's accuracy and compare it with its "
                   "modelcall_demo.json")
    # NOTE: one thread: on this shared 2-core machine two threads ran a matmul at half the speed of one.
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, help=f"a pilot run: this many steps, not {TRAIN['steps']} (recorded)")
    p.add_argument("--bare-steps", type=int, help=f"warm-up steps, not {TRAIN['bare_steps']} (recorded)")
    p.add_argument("--layers", type=int, help=f"layers, not {MODEL['num_hidden_layers']} (recorded)")
    a = p.parse_args(argv)
    if a.steps:
        TRAIN["steps"] = a.steps
    if a.bare_steps is not None:
        TRAIN["bare_steps"] = a.bare_steps
    if a.layers:
        MODEL["num_hidden_layers"] = a.layers
    if a.check:
        with open(os.path.join(a.check, "modelcall_demo.json"), encoding="utf-8") as f:
            record = json.load(f)
        claimed, got = record["accuracy"], measure(a.check, threads=a.threads)
        if "eval_split" in record:   # trainer 4 on: the hand-written split too
            claimed, got = {**claimed, "eval_split": record["eval_split"]}, {**got, "eval_split": measure_eval(a.check)}
        print(json.dumps({"claimed": claimed, "measured": got}, indent=2))
        return 0 if got == claimed else 1
    if not a.out:
        p.error("give --out DIR or --check DIR")
    meta = train(a.out, threads=a.threads)
    print(json.dumps({k: meta[k] for k in ("accuracy", "train_wall_seconds", "train_cpu_seconds")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
