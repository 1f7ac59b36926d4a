"""The two real GGUF files users have (SmolLM2-135M-Instruct Q4_1, Gemma 3 270M Q4_K_M, fetched from their registry
packages into the user cache) served as users run them: a chat answer through the openai SDK, `modelcall serve
--model FILE.gguf` as a process, Gemma's turn format, the default model, and resident memory. Their agreement with
transformers on the same files is test_gguf_models.py."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import openai
import pytest
import requests

from modelcall.core import Kernel
from modelcall.plugins.registry_models import fetch
from modelcall.plugins.runner import quant

from http_server import ServerThread

# NOTE: the slow tier: each test loads a real model, Gemma's 262k-token vocabulary is slow to describe and to serve
pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(1200)]

MODELS = ("smollm2", "gemma3-270m")
KV_GB = 1 / 8


def test_smollm2_answers_a_factual_question_through_the_openai_sdk():
    path = fetch.ensure("smollm2", quiet=True)
    with ServerThread(model=path, max_model_len=1024) as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none")
        models = [m.id for m in client.models.list().data]
        reply = client.chat.completions.create(model=models[0], temperature=0, max_tokens=32,
                                               messages=[{"role": "user", "content": "What is the capital of France?"}])
        metrics = requests.get(server.base_url + "/metrics", timeout=10).text
    weights = next(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                   if line.startswith("modelcall:model_weight_bytes{"))
    assert 0.9 * os.path.getsize(path) <= weights <= 1.1 * os.path.getsize(path), weights   # kept quantized
    text = reply.choices[0].message.content
    assert "Paris" in text, text
    assert reply.choices[0].finish_reason == "stop"   # the chat template's <|im_end|> ends the turn


# the prompt each file's own chat template makes of one question, ending where the model's turn begins
TURNS = {"smollm2": "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
         "gemma3-270m": "<bos><start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n"}


@pytest.mark.parametrize("name", MODELS)
def test_modelcall_serve_takes_the_gguf_file_and_reports_its_weights(name, tmp_path):
    """`modelcall serve --model FILE.gguf`, the command that once answered "model directory ... does not exist": it
    serves the file under its own name with its own chat template, and the resident weights are in the load log line
    and in /metrics, within a tenth of the file."""
    path = fetch.ensure(name, quiet=True)
    log = tmp_path / "serve.log"
    cli = os.path.join(os.path.dirname(sys.executable), "modelcall")
    with open(log, "w") as err:
        proc = subprocess.Popen([cli, "serve", "--model", path, "--port", "0", "--threads", "1",
                                 "--num-kv-blocks", "128", "--max-model-len", "512"], stdout=subprocess.PIPE,
                                stderr=err, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        url = next((m.group(1) for line in proc.stdout if (m := re.search(r" on (http://\S+)", line))), None)
        assert url is not None, log.read_text()[-2000:]
        client = openai.OpenAI(base_url=url + "/v1", api_key="none")
        model = os.path.basename(path).removesuffix(".gguf")
        assert [card.id for card in client.models.list().data] == [model]
        question = [{"role": "user", "content": "What is the capital of France?"}]
        rendered = requests.post(url + "/tokenize", json={"messages": question}, timeout=30)
        assert rendered.ok, rendered.text   # a file with no template of its own and none chosen: 400
        ids = rendered.json()["tokens"]
        prompt = requests.post(url + "/detokenize", json={"tokens": ids}, timeout=30).json()["prompt"]
        reply = client.chat.completions.create(model=model, messages=question, max_tokens=24, temperature=0)
        metrics = requests.get(url + "/metrics", timeout=10).text
    finally:
        proc.terminate()
        proc.wait(30)
    assert prompt.endswith(TURNS[name]), prompt
    assert reply.usage.prompt_tokens == len(ids)
    if name == "smollm2":   # an instruct model; Gemma 3 270M is a base model (its answer is not checked)
        assert "Paris" in reply.choices[0].message.content, reply.choices[0].message.content
    loaded = re.search(r"loaded .*\.gguf .*weights ([0-9.]+) MB, GGUF ([0-9.]+) MB", log.read_text())
    assert loaded is not None, log.read_text()[-2000:]
    weights = next(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                   if line.startswith("modelcall:model_weight_bytes{"))
    size = os.path.getsize(path)
    print(f"{name}: load line weights {loaded.group(1)} MB, GGUF {loaded.group(2)} MB; /metrics {weights:.0f} B")
    assert abs(float(loaded.group(1)) - weights / 1e6) <= 0.05 and float(loaded.group(2)) == round(size / 1e6, 1)
    assert weights <= 1.1 * size


async def test_gemma_serves_with_its_turn_format_and_stops_at_the_end_of_a_turn():
    """Gemma 3 270M is a base model whose file carries no template: Gemma's turn format is used (gguf_file.py), and
    its end-of-turn token ends a turn. (Asked in chat it repeats the question: transformers' generate on the same
    ids does too, checked when this test was written.)"""
    path = fetch.ensure("gemma3-270m", quiet=True)
    async with Kernel(model=path, kv_cache_memory_gb=KV_GB, max_model_len=512) as k:
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}]
        prompt = k.tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
        assert prompt == ("<bos><start_of_turn>user\nBe brief.\n\nName a color.<end_of_turn>\n"
                          "<start_of_turn>model\n")
        end_of_turn = k.tokenizer.hf.convert_tokens_to_ids("<end_of_turn>")
        assert end_of_turn in k.tokenizer.eos_token_ids
        done = await k.complete(messages=msgs, max_tokens=24, temperature=0)
        assert done.usage.prompt_tokens == len(k.tokenizer.encode(prompt, add_special_tokens=False))
        assert done.text.strip()


async def test_default_model_is_smollm2_and_the_demo_is_one_name_away(monkeypatch):
    monkeypatch.delenv("MODELCALL_DEMO_MODEL", raising=False)
    fetch.ensure("smollm2", quiet=True)
    async with Kernel(kv_cache_memory_gb=KV_GB, max_model_len=512) as k:
        assert k.model_name == "SmolLM2-135M-Instruct.Q4_1"
        done = await k.complete(messages=[{"role": "user", "content": "What is the capital of France?"}],
                                max_tokens=16, temperature=0)
    assert "Paris" in done.text
    async with Kernel(model="trained", kv_cache_memory_gb=KV_GB, max_model_len=512) as k:
        assert k.model_name == "trained"
        from modelcall.plugins.demo_model import trained_model_dir
        assert os.path.realpath(k.model_dir) == os.path.realpath(trained_model_dir())


_RSS = r"""
import json, os, sys
GGUF = os.path.realpath(sys.argv[1])
def resident():
    # -> (own, VmRSS) in bytes. own: every anonymous page wherever mapped, and the GGUF file's pages where it is
    # mapped; not the pages of shared libraries read from disk
    own = 0
    with open("/proc/self/smaps") as f:
        for line in f:
            key = line.split(None, 1)[0]
            if not key.endswith(":"):   # a mapping's header: address perms offset dev inode [path]
                fields = line.split(None, 5)
                path = fields[5].strip() if len(fields) > 5 else ""
                library = path.startswith("/") and path != GGUF and not path.startswith(("/memfd:", "/dev/zero"))
            elif key == ("Anonymous:" if library else "Rss:"):
                own += int(line.split()[1]) * 1024
    with open("/proc/self/status") as f:
        return own, next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS"))
import torch, transformers
from transformers import AutoConfig, AutoModelForCausalLM
from modelcall.core import KernelConfig
from modelcall.plugins.runner import cpu_kernel, fused_ops, gguf_file, quant
from modelcall.plugins.runner.runner import TorchModelRunner
from modelcall.plugins.sampler.sampler import TorchSampler
import transformers.models.gemma3.modeling_gemma3   # code, not model memory: imported before the baseline
quant.load(), cpu_kernel.load(), fused_ops.load()   # the C libraries too (built once per machine)
model_dir = gguf_file.materialize(sys.argv[1], {n for n, v in quant.GGML_TYPES.items() if quant.supported(v)})
before = resident()
runner = TorchModelRunner(KernelConfig(model=sys.argv[1], threads=1), model_dir, TorchSampler())
runner.allocate_kv_cache(64, 16)
after = resident()
print(json.dumps({"delta": after[0] - before[0], "vmrss_delta": after[1] - before[1],
                  "kv": runner.kv_block_bytes(16) * 64, "weights": runner.weight_bytes,
                  "huge": runner.huge_pages.huge_bytes if runner.huge_pages else 0,
                  "thp": open("/sys/kernel/mm/transparent_hugepage/enabled").read()}))
"""


def test_gemma_q4_k_m_resident_memory_within_a_tenth_of_the_file():
    """What loading the model adds to the process (its runner: weights, buffers, the KV cache), measured in a fresh
    process around the runner's construction: its anonymous pages and any of the GGUF file's.

    NOTE: the tokenizer is not in it: Gemma's 262k-token vocabulary with 515k merges takes ~380 MB in the tokenizers
    library itself (measured apart), which is no weight memory. Nor are the pages of shared libraries that building
    the model reads in (libtorch_cpu.so's code, ~11 MB of VmRSS here): they are code mapped from disk, shared with
    every process using torch, and how many show depends on the machine's page cache and file system; VmRSS's own
    growth is printed beside the figure."""
    from modelcall.plugins.runner import gguf_file
    path = fetch.ensure("gemma3-270m", quiet=True)
    # described here first, so the child only reads the description: a first description builds the tokenizer,
    # whose freed ~380 MB the weights would then reuse unseen (190 MB measured that way, 263 MB after)
    gguf_file.materialize(path, {n for n, v in quant.GGML_TYPES.items() if quant.supported(v)})
    # NOTE: a child started under coverage (pytest-cov 6's COV_CORE_* variables, coverage's own
    # COVERAGE_PROCESS_START / _CONFIG) would trace every line it runs: the model is measured untraced. pytest-cov
    # 7 sets none of them (checked: CI's run is not explained by them), so this guards the measurement only.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COV_CORE_", "COVERAGE_PROCESS_"))}
    out = subprocess.run([sys.executable, "-c", _RSS, path], capture_output=True, text=True, timeout=600,
                         env={**env, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    m = json.loads(out.stdout.strip().splitlines()[-1])
    size = os.path.getsize(path)
    print(f"file {size / 1e6:.1f} MB, resident growth {m['delta'] / 1e6:.1f} MB (VmRSS {m['vmrss_delta'] / 1e6:.1f} "
          f"MB with library code), weights {m['weights'] / 1e6:.1f} MB ({m['huge'] / 1e6:.1f} MB on 2 MiB pages), "
          f"KV {m['kv'] / 1e6:.1f} MB")
    assert m["weights"] <= 1.1 * size
    assert m["delta"] <= 1.1 * size + m["kv"], (m, size)
    if "[never]" not in m["thp"]:   # the weights a decode step streams are on 2 MiB pages (plugins/runner/huge_pages.py)
        assert m["huge"] >= 0.95 * m["weights"], m
