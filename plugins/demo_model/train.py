"""Train the demo model that answers (seeded, CPU, about 10 minutes on two cores):

    python -m modelcall.plugins.demo_model.train --out plugins/demo_model/trained
    python -m modelcall.plugins.demo_model.train --check plugins/demo_model/trained   # accuracy only

A byte-level BPE tokenizer is trained on the corpus (plugins/demo_model/corpus.py), then a ~3M
parameter Llama learns the chats, the loss on the assistant's tokens only. Every chat of a batch
offers the same tools, so the long system block (the tools' JSON) is run once per batch and its keys
and values are shared by the batch's rows: the cost of a step is the rows' own tokens.

The output directory holds the model, the tokenizer with the demo chat template and
`modelcall_demo.json`: the seed, the steps, and the accuracy measured on held-out questions
(greedy generation through the chat template, the tool run by the same code the agent runs).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from typing import Any

from modelcall.plugins.demo_model import corpus
from modelcall.plugins.demo_model.build import bpe_tokenizer
from modelcall.plugins.demo_model.template import CHAT_TEMPLATE
from modelcall.plugins.demo_model.tools import calculator, format_number, evaluate, weather_of

TRAINER_VERSION = "1"
SEED = 0
# The stdlib tokenizer's split, plus one piece per Han character, so a Chinese city name is the same
# tokens in the question and in the call's arguments (copying is then easy).
SPLIT = (r"\p{Han}|(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
MODEL = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, max_position_embeddings=2048, tie_word_embeddings=True,
             rope_theta=10000.0)
# Two phases: everything (the formats, the facts), then mostly the tool chats, where the model has to
# learn to copy (the expression, the city, the result); the first phase alone learns the formats only.
TRAIN = dict(chats=14000, steps=600, batch=32, lr=3e-3, warmup=50, weight_decay=0.01,
             copy_steps=700, copy_lr=2e-3, copy_warmup=20, copy_facts=0.1, more_copy_steps=[500])


def build_tokenizer(texts: list[str]):  # -> transformers.PreTrainedTokenizerFast
    """The random demo model's tokenizer recipe trained on the corpus, with this model's split."""
    return bpe_tokenizer(lambda tok, trainer: tok.train_from_iterator(texts, trainer), SPLIT,
                         MODEL["max_position_embeddings"])


def render(tok: Any, messages: list[dict], tools: list[dict] | None, gen: bool = False) -> str:
    return tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen)


def examples(tok: Any, chat: dict[str, Any]) -> list[tuple[str, list[tuple[str, bool]]]]:
    """A chat as training rows: (system block, [(text, learn it)]). A chat whose first call had a
    `<think>` gives two rows, as a server sees them: the first turn with its thinking, and the whole
    chat without it (the agent does not send reasoning back), learning the last answer only."""
    tools, msgs = chat["tools"], chat["messages"]
    system = render(tok, msgs[:1], tools).split("<|im_start|>user", 1)[0]
    rows = []
    thought = any(m.get("reasoning_content") for m in msgs)
    plain = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in msgs]
    if thought:
        first = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
        rows.append(_pieces(tok, msgs[:first + 1], tools, system, learn_from=first))
        rows.append(_pieces(tok, plain, tools, system, learn_from=len(plain) - 1))
    else:
        rows.append(_pieces(tok, plain, tools, system, learn_from=0))
    return [(system, r) for r in rows]


def _pieces(tok: Any, msgs: list[dict], tools: Any, system: str, learn_from: int) -> list[tuple[str, bool]]:
    out, done = [], system
    for i, m in enumerate(msgs):
        if m["role"] == "assistant":
            prompt = render(tok, msgs[:i], tools, gen=True)
            out.append((prompt[len(done):], False))
            full = render(tok, msgs[:i + 1], tools)
            reply = full[len(prompt):]
            assert reply.endswith("<|im_end|>\n"), reply
            out.append((reply[:-1], i >= learn_from))
            out.append(("\n", False))
            done = full
    return out


def tokenize_rows(tok: Any, rows: list[tuple[tuple[str, list[tuple[str, bool]]], bool]]) -> dict[str, list]:
    """Group rows by system block: {system text: [((ids, learn mask), calls a tool)]}."""
    groups: dict[str, list] = {}
    for (system, pieces), tooly in rows:
        ids, mask = [], []
        for text, learn in pieces:
            t = tok(text, add_special_tokens=False).input_ids
            ids += t
            mask += [learn] * len(t)
        groups.setdefault(system, []).append(((ids, mask), tooly))
    return groups


def train(out_dir: str, *, steps: int | None = None, threads: int = 1, log: Any = print,
          resume: str | None = None, resume_phases: int = 1) -> dict[str, Any]:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(SEED)
    t0 = time.monotonic()
    chats = list(corpus.chats(TRAIN["chats"], seed=SEED))
    tok = build_tokenizer([render_any(c) for c in chats[:4000]] + [json.dumps(t.openai()) for t in corpus.TOOLS])
    rows = [(r, any(m.get("tool_calls") for m in c["messages"])) for c in chats for r in examples(tok, c)]
    groups = tokenize_rows(tok, rows)
    system_ids = {s: tok(s, add_special_tokens=False).input_ids for s in groups}
    log(f"corpus: {len(chats)} chats, {len(rows)} rows, {len(groups)} system blocks "
        f"({max(len(v) for v in system_ids.values())} tokens at most), vocab {len(tok)}, "
        f"{time.monotonic() - t0:.1f}s")

    eos = [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    cfg = LlamaConfig(vocab_size=len(tok), eos_token_id=eos[0], pad_token_id=eos[1], bos_token_id=None,
                      torch_dtype="float32", **MODEL)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    log(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")
    phases = [("all", TRAIN["steps"] if steps is None else steps, TRAIN["lr"], TRAIN["warmup"])]
    if steps is None:
        phases.append(("tools", TRAIN["copy_steps"], TRAIN["copy_lr"], TRAIN["copy_warmup"]))
        phases += [("tools", n, TRAIN["copy_lr"], TRAIN["copy_warmup"]) for n in TRAIN.get("more_copy_steps", [])]
    done = 0
    if resume:
        # NOTE: resume=DIR holds the first phase's weights (a run stopped after it); the phases after
        # it start from a fresh optimizer and their own seeded order either way, so the result is the same.
        model.load_state_dict(LlamaForCausalLM.from_pretrained(resume, dtype=torch.float32).state_dict())
        done = resume_phases
    for n, (kind, phase_steps, lr, warmup) in enumerate(phases):
        if n < done:
            continue
        rng = random.Random(SEED + n)
        chosen = {s: [r for r, tooly in v if kind == "all" or tooly or rng.random() < TRAIN["copy_facts"]]
                  for s, v in groups.items()}
        _run_phase(model, chosen, system_ids, phase_steps, lr, warmup, rng, eos[1], log, t0, kind)
    model.eval()
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=eos[1], bos_token_id=None)
    os.makedirs(out_dir, exist_ok=True)
    tok.save_pretrained(out_dir)
    model.save_pretrained(out_dir)
    accuracy = measure(out_dir, threads=threads)
    meta = {"trainer_version": TRAINER_VERSION, "seed": SEED, "steps": [p[1] for p in phases],
            "model": MODEL, "train": TRAIN,
            "parameters": sum(p.numel() for p in model.parameters()), "torch": torch.__version__,
            "train_seconds": round(time.monotonic() - t0), "resumed_after_phase_1": bool(resume),
            "accuracy": accuracy}
    with open(os.path.join(out_dir, "modelcall_demo.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")
    return meta


def render_any(chat: dict[str, Any]) -> str:
    """A chat's text for training the tokenizer (any tokenizer renders the template the same)."""
    return _plain_tok().apply_chat_template(chat["messages"], tools=chat["tools"], tokenize=False)


_PLAIN: list[Any] = []


def _plain_tok():
    if not _PLAIN:
        from tokenizers import Tokenizer, models
        from transformers import PreTrainedTokenizerFast
        t = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()))
        t.chat_template = CHAT_TEMPLATE
        _PLAIN.append(t)
    return _PLAIN[0]


def _run_phase(model: Any, groups: dict[str, list], system_ids: dict[str, list[int]], steps: int, lr: float,
               warmup: int, rng: random.Random, pad: int, log: Any, t0: float, kind: str) -> None:
    import torch
    from transformers import DynamicCache

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": TRAIN["weight_decay"]},
                             {"params": other, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) *
                                              0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    # Batches of rows of about one length (sorted, then cut), drawn in a seeded order: little padding.
    batches = []
    for system in sorted(groups):
        ordered = sorted(groups[system], key=lambda r: len(r[0]))
        batches += [(system, ordered[i:i + TRAIN["batch"]]) for i in range(0, len(ordered), TRAIN["batch"])]
    order: list[int] = []
    model.train()
    for step in range(steps):
        if not order:
            order = list(range(len(batches)))
            rng.shuffle(order)
        system, batch = batches[order.pop()]
        loss = _loss(model, system_ids[system], batch, pad, torch, DynamicCache)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 25 == 0 or step == steps - 1:
            log(f"{kind} step {step}/{steps} loss {loss.item():.4f} {time.monotonic() - t0:.0f}s")


def _loss(model: Any, system: list[int], batch: list[tuple[list[int], list[bool]]], pad: int, torch: Any,
          DynamicCache: Any) -> Any:
    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    attn = torch.zeros((len(batch), len(system) + width), dtype=torch.long)
    attn[:, :len(system)] = 1
    for i, (row, mask) in enumerate(batch):
        ids[i, :len(row)] = torch.tensor(row)
        attn[i, len(system):len(system) + len(row)] = 1
        # label of position j is the token at j+1 when that token is learnt
        for j in range(len(row) - 1):
            if mask[j + 1]:
                labels[i, j] = row[j + 1]
    if system:
        prefix = model.model(input_ids=torch.tensor([system]), use_cache=True).past_key_values
        shared = DynamicCache(ddp_cache_data=[
            (layer.keys.expand(len(batch), -1, -1, -1), layer.values.expand(len(batch), -1, -1, -1))
            for layer in prefix.layers])
    else:
        shared = None
    pos = torch.arange(len(system), len(system) + width).unsqueeze(0).expand(len(batch), -1)
    hidden = model.model(input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=shared,
                         use_cache=shared is not None).last_hidden_state
    # NOTE: logits only where a token is learnt (under half the positions): the head is a large part
    # of a step in a model this small.
    learnt = labels != -100
    logits = model.lm_head(hidden[learnt])
    return torch.nn.functional.cross_entropy(logits, labels[learnt])


# ---- measuring ----------------------------------------------------------------------------------

def measure(model_dir: str, *, threads: int = 1, n: int = 40) -> dict[str, Any]:
    """Greedy answers on held-out questions, the tool run between the two turns as an agent runs it:
    arithmetic (HELD_OUT expressions, new phrasings mixed in), weather (every city, both languages)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rng = random.Random(7)
    tools = [t.openai() for t in corpus.TOOLS]
    arith_ok = 0
    for i, e in enumerate(corpus.held_out(n)):
        lang = "en" if i % 2 == 0 else "zh"
        q = rng.choice(corpus.ARITH_EN if lang == "en" else corpus.ARITH_ZH).format(e=e)
        arith_ok += arithmetic_correct(tok, model, tools, q, e)
    weather_ok, cities = 0, 0
    for en, zh in corpus.CITIES:
        for name, lang in ((en, "en"), (zh, "zh")):
            q = rng.choice(corpus.WEATHER_EN if lang == "en" else corpus.WEATHER_ZH).format(c=name)
            weather_ok += weather_correct(tok, model, tools, q, name)
            cities += 1
    return {"arithmetic_held_out": {"asked": n, "correct": arith_ok},
            "weather": {"asked": cities, "correct": weather_ok}}


def _generate(tok: Any, model: Any, messages: list[dict], tools: list[dict], max_new: int = 64) -> str:
    import torch
    ids = tok(render(tok, messages, tools, gen=True), add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new, do_sample=False)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def parse_call(text: str) -> dict[str, Any] | None:
    if "<tool_call>" not in text or "</tool_call>" not in text:
        return None
    body = text.split("<tool_call>", 1)[1].split("</tool_call>", 1)[0]
    try:
        call = json.loads(body)
        return call if isinstance(call, dict) and isinstance(call.get("arguments"), dict) else None
    except ValueError:
        return None


def arithmetic_correct(tok: Any, model: Any, tools: list[dict], question: str, expression: str) -> bool:
    msgs: list[dict] = [{"role": "user", "content": question}]
    call = parse_call(_generate(tok, model, msgs, tools))
    if not call or call.get("name") != "calculator":
        return False
    asked = str(call["arguments"].get("expression", ""))
    try:
        result = calculator(asked)
    except ValueError:
        return False
    msgs += [{"role": "assistant", "content": "", "tool_calls": [corpus._call("calculator", call["arguments"])]},
             {"role": "tool", "tool_call_id": "call_0_0", "content": result}]
    answer = _generate(tok, model, msgs, tools)
    return result == format_number(evaluate(expression)) and result in answer


def weather_correct(tok: Any, model: Any, tools: list[dict], question: str, city: str) -> bool:
    msgs: list[dict] = [{"role": "user", "content": question}]
    call = parse_call(_generate(tok, model, msgs, tools))
    if not call or call.get("name") != "get_weather" or call["arguments"].get("city") != city:
        return False
    report = weather_of(city)
    msgs += [{"role": "assistant", "content": "", "tool_calls": [corpus._call("get_weather", call["arguments"])]},
             {"role": "tool", "tool_call_id": "call_0_0", "content": json.dumps(report, ensure_ascii=False)}]
    return f"{report['temperature_c']}°C" in _generate(tok, model, msgs, tools)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write the trained model here")
    p.add_argument("--check", metavar="DIR", help="measure a trained model's accuracy and compare it with its "
                   "modelcall_demo.json")
    p.add_argument("--steps", type=int, help="only the first phase, this many steps (a quick trial)")
    p.add_argument("--resume", metavar="DIR", help="a first phase's output: run the phases after it")
    p.add_argument("--resume-phases", type=int, default=1, metavar="N", help="phases DIR already holds")
    # NOTE: one thread: on this shared 2-core machine two threads ran a matmul at half the speed of one.
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    if a.check:
        with open(os.path.join(a.check, "modelcall_demo.json"), encoding="utf-8") as f:
            claimed = json.load(f)["accuracy"]
        got = measure(a.check, threads=a.threads)
        print(json.dumps({"claimed": claimed, "measured": got}, indent=2))
        return 0 if got == claimed else 1
    if not a.out:
        p.error("give --out DIR or --check DIR")
    meta = train(a.out, steps=a.steps, threads=a.threads, resume=a.resume, resume_phases=a.resume_phases)
    print(json.dumps(meta["accuracy"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
