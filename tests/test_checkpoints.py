"""Checkpoint and tokenizer details users hit: fp16/bf16 checkpoints on CPU, tied embeddings, EOS lists in
generation_config.json, chat templates that write `{{ bos_token }}`, `--chat-template FILE` and
`--tokenizer DIR` overrides."""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from family_models import TOKENIZER_FILES, build_family


pytestmark = pytest.mark.anyio

PROMPT = [11, 523, 88, 1400, 97, 5, 1203, 640, 77, 31, 900, 14]
N = 10


def _reference(model_dir: str, dtype: torch.dtype = torch.float32) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=dtype).eval()
    ids = torch.tensor([PROMPT])
    gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return gen[0, len(PROMPT):].tolist()


async def _greedy(make_kernel, model_dir: str, ignore_eos: bool = True, **config):
    async with make_kernel(model=model_dir, **config) as kernel:
        done = await kernel.complete(prompt_token_ids=PROMPT, max_tokens=N, temperature=0, ignore_eos=ignore_eos)
        return kernel, done


async def _teacher_forced(make_kernel, model_dir: str, ids: list[int], **config) -> tuple[str, list[float]]:
    """The dtype the kernel computed in, and its log-probability of each token of `ids` given the ones before."""
    from modelcall.events import PromptLogprobs

    async with make_kernel(model=model_dir, **config) as kernel:
        async for ev in kernel.generate(prompt_token_ids=ids, max_tokens=1, temperature=0, prompt_logprobs=0):
            if type(ev) is PromptLogprobs:
                return kernel.spec.dtype, [p.logprob for p in ev.logprobs[1:]]
    raise AssertionError("no prompt logprobs")


def _transformers_logprobs(model_dir: str, ids: list[int], dtype: torch.dtype) -> tuple[list[float], float]:
    """transformers' own log-probabilities of `ids` in `dtype`, and the largest |logit| (the scale of its error)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=dtype).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    return [lp[i, ids[i + 1]].item() for i in range(len(ids) - 1)], logits.abs().max().item()


@pytest.mark.parametrize("ckpt_dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
async def test_half_precision_checkpoints_run_on_cpu(make_kernel, tmp_path, demo_model_dir, ckpt_dtype):
    model_dir = build_family("qwen3", str(tmp_path / "m"), demo_model_dir, dtype=ckpt_dtype)
    name = str(ckpt_dtype).removeprefix("torch.")
    assert json.load(open(os.path.join(model_dir, "config.json")))["dtype"] == name
    # upcast to fp32 (weights exactly the checkpoint's values): transformers' upcast output, token for token
    kernel, done = await _greedy(make_kernel, model_dir, dtype="float32", kv_cache_dtype="float32")
    ref = _reference(model_dir, torch.float32)
    assert done.token_ids == ref
    # auto (fp32 or bf16, whichever is faster here; never fp16 on CPU) and the checkpoint's own dtype (the
    # portable attention path for fp16: the C kernel takes fp32/bf16): each position's log-probability equals
    # transformers' in the dtype the kernel computed in.
    # NOTE: within 2 ulps of that dtype at the logits' scale (|logits| ~19 here): bf16 0.30, fp16 0.037, fp32
    # 1e-4 at least. Measured on qwen3: fp16 and fp32 <1e-4, bf16 0.089 (the lean stack against transformers'
    # bf16 modules); logits 10% off (a lost logit scale) give ~1.
    ids = PROMPT + ref
    for config, computes_in in (({}, ("float32", "bfloat16")), ({"dtype": name}, (name,))):
        dtype, got = await _teacher_forced(make_kernel, model_dir, ids, **config)
        assert dtype in computes_in, (config, dtype)
        want, scale = _transformers_logprobs(model_dir, ids, getattr(torch, dtype))
        tol = max(1e-4, 2 * torch.finfo(getattr(torch, dtype)).eps * scale)
        worst = max(abs(a - b) for a, b in zip(got, want))
        assert len(got) == len(want) and worst <= tol, (config, dtype, worst, tol)


async def test_tied_embeddings_checkpoint_has_no_lm_head_and_matches(make_kernel, tmp_path, demo_model_dir):
    from safetensors import safe_open

    model_dir = build_family("qwen3", str(tmp_path / "m"), demo_model_dir, tie_word_embeddings=True)
    with safe_open(os.path.join(model_dir, "model.safetensors"), "pt") as f:
        assert not any("lm_head" in k for k in f.keys())
    _, done = await _greedy(make_kernel, model_dir, dtype="float32")
    assert done.token_ids == _reference(model_dir)


async def test_eos_list_in_generation_config_stops_at_any_of_them(make_kernel, tmp_path, demo_model_dir):
    model_dir = build_family("llama3", str(tmp_path / "m"), demo_model_dir)
    ref = _reference(model_dir)
    k = next(i for i in range(2, N) if ref[i] not in ref[:i])   # a token first emitted at step k >= 2
    with open(os.path.join(model_dir, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [2, ref[k]], "bos_token_id": 1}, f)
    kernel, done = await _greedy(make_kernel, model_dir, ignore_eos=False, dtype="float32")
    assert ref[k] in kernel.spec.eos_token_ids and ref[k] in kernel.tokenizer.eos_token_ids
    assert done.finish_reason == "stop"
    assert done.token_ids[:k] == ref[:k] and len(done.token_ids) <= k + 1


BOS_TEMPLATE = ("{{- bos_token -}}{%- for m in messages -%}{{- '<|im_start|>' + m.role + '\\n' + m.content + "
                "'<|im_end|>\\n' -}}{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
                "{%- endif -%}")


async def test_chat_template_file_and_bos_token_from_the_model_config(make_kernel, tmp_path, demo_model_dir):
    model_dir = build_family("llama3", str(tmp_path / "m"), demo_model_dir)   # config.json: bos_token_id 1
    template = tmp_path / "bos.jinja"
    template.write_text(BOS_TEMPLATE)
    from transformers import PreTrainedTokenizerFast
    assert PreTrainedTokenizerFast.from_pretrained(model_dir).bos_token is None   # the tokenizer files name none
    bos = "<|im_start|>"   # id 1: config.json's bos_token_id
    async with make_kernel(model=model_dir, chat_template=str(template)) as kernel:
        text = kernel.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
        assert text == bos + "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        assert kernel.tokenizer.encode(text)[:2] == [1, 1]   # BOS as its special token, then the turn's
        done = await kernel.complete(messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0,
                                     ignore_eos=True)
        assert done.usage.prompt_tokens == len(kernel.tokenizer.encode(text))
    with pytest.raises(Exception, match="chat template file .*missing.jinja. cannot be read"):
        async with make_kernel(model=model_dir, chat_template=str(tmp_path / "missing.jinja")):
            pass


async def test_tokenizer_dir_serves_a_checkpoint_without_tokenizer_files(make_kernel, tmp_path, demo_model_dir):
    model_dir = build_family("llama3", str(tmp_path / "m"), demo_model_dir)
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    for f in TOKENIZER_FILES:
        shutil.move(os.path.join(model_dir, f), tok_dir / f)
    assert not any(f.startswith("tokenizer") for f in os.listdir(model_dir))
    async with make_kernel(model=model_dir, tokenizer_dir=str(tok_dir), dtype="float32") as kernel:
        done = await kernel.complete("hello there", max_tokens=4, temperature=0, ignore_eos=True)
        assert len(done.token_ids) == 4 and kernel.tokenizer.hf.chat_template


def test_cli_options_reach_the_config(tmp_path):
    import argparse

    from modelcall.core.commands import add_kernel_options, config_from_args

    parser = argparse.ArgumentParser()
    add_kernel_options(parser)
    args = parser.parse_args(["--model", "org/name", "--revision", "v1", "--download-dir", str(tmp_path),
                              "--tokenizer", "/tok", "--chat-template", "/t.jinja"])
    cfg = config_from_args(args)
    assert (cfg.model, cfg.revision, cfg.download_dir, cfg.tokenizer_dir, cfg.chat_template) == (
        "org/name", "v1", str(tmp_path), "/tok", "/t.jinja")
    assert cfg.tokenizer == "auto"   # the stage choice is --stage tokenizer=NAME, untouched
