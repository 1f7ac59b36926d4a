"""The demo model builds offline, byte-for-byte the same every time, and behaves like a real model."""
from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
import threading

import pytest
import torch

from modelcall.plugins.demo_model import BUILDER_VERSION, build_demo_model, cache_root


def _hashes(path: str) -> dict[str, str]:
    out = {}
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


# Built in a fresh interpreter whose hash seed and global RNG state differ from those of the process that
# built the cached copy: a build that leaned on either (set order, an unseeded draw) gives other bytes.
OTHER_PROCESS = """
import random, sys, torch
random.seed(99); torch.manual_seed(99); torch.rand(7)
from modelcall.plugins.demo_model import build_demo_model
build_demo_model(sys.argv[1])
"""
# NOTE: read at collection, before any test can build it: a cache that is there now was built by another
# process, which had another hash seed unless PYTHONHASHSEED fixes them all. Then this process is the
# other interpreter, and the fresh one (~5 s of CPU to import torch and transformers again) is not needed.
CACHED = os.path.join(cache_root(), f"demo-model-{BUILDER_VERSION}")
HASH_SEED = os.environ.get("PYTHONHASHSEED", "random")
CACHE_FROM_ANOTHER_PROCESS = os.path.isdir(CACHED) and HASH_SEED == "random"


def _build_with_other_rng_state(out: str) -> None:
    """build_demo_model after draws from the global RNGs (restored after: other tests keep theirs)."""
    state = random.getstate()
    try:
        with torch.random.fork_rng(devices=[]):
            random.seed(99)
            torch.manual_seed(99)
            torch.rand(7)
            build_demo_model(out)
    finally:
        random.setstate(state)


def test_building_twice_gives_identical_files(tmp_path, demo_model_dir):
    fresh = str(tmp_path / "fresh")
    if CACHE_FROM_ANOTHER_PROCESS and demo_model_dir == CACHED:
        _build_with_other_rng_state(fresh)   # the cache came from another interpreter: build here
    else:  # the cache was built by this process (or every process has one hash seed): build in a fresh one
        seed = "54321" if HASH_SEED == "12345" else "12345"
        done = subprocess.run([sys.executable, "-c", OTHER_PROCESS, fresh], env={**os.environ, "PYTHONHASHSEED": seed},
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-2000:]
    assert _hashes(fresh) == _hashes(demo_model_dir)
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= set(_hashes(fresh))
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".demo-model-build-")]  # no temp left


def test_building_into_a_non_empty_directory_is_refused(tmp_path):
    (tmp_path / "x").write_text("keep me")
    with pytest.raises(FileExistsError, match="not empty"):
        build_demo_model(str(tmp_path))
    assert (tmp_path / "x").read_text() == "keep me"


def test_loads_with_transformers_and_greedy_output_is_varied(demo_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(demo_model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(demo_model_dir, local_files_only=True)
    cfg = model.config
    assert (cfg.model_type, cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers) == ("llama", 2048, 128, 2)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (4, 2, 32)
    assert cfg.max_position_embeddings == 4096 and cfg.tie_word_embeddings
    assert model.dtype == torch.float32
    assert tok.eos_token == "<|im_end|>" and cfg.eos_token_id == tok.eos_token_id
    ids = torch.tensor([tok.encode("def main():\n    return", add_special_tokens=False)])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False)
    new = out[0, ids.shape[1]:].tolist()
    assert len(set(new)) > 8, new


@pytest.mark.parametrize("text", ["你好，世界！", "emoji 🎉👨‍👩‍👧 ok", "mixé ✓ 日本語"])
def test_any_text_round_trips_through_the_byte_level_tokenizer(demo_model_dir, text):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(demo_model_dir, local_files_only=True)
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_tags_are_plain_added_tokens_and_control_tokens_are_special(demo_model_dir):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(demo_model_dir, local_files_only=True)
    text = "<|im_start|>a<think>b</think><tool_call>c</tool_call><|im_end|>"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == 9
    assert tok.decode(ids, skip_special_tokens=True) == "a<think>b</think><tool_call>c</tool_call>"


def test_plugin_provides_the_cached_directory(tmp_path, monkeypatch):
    from modelcall.core import KernelConfig, PluginHost
    from modelcall.plugins.demo_model import build, plugin

    calls: list = []
    monkeypatch.setattr(build, "write_demo_model", _fake_writer(calls))
    monkeypatch.setenv("MODELCALL_CACHE_DIR", str(tmp_path))
    host = PluginHost([plugin], load_entrypoints=False)
    # the cache directory is named for the builder version, so a changed builder never serves old files
    expected = str(tmp_path / f"demo-model-{build.BUILDER_VERSION}")
    assert host.provide("provide_model_dir", "model", config=KernelConfig()) == expected
    assert host.provide("provide_model_dir", "model", config=KernelConfig()) == expected and len(calls) == 1
    assert os.listdir(expected) == ["config.json"]
    assert plugin.provide_model_dir(config=KernelConfig(model=str(tmp_path))) is None  # a model is configured


def _fake_writer(calls: list, barrier=None):
    def write(out_dir: str) -> str:
        calls.append(out_dir)
        if barrier is not None:
            barrier.wait()  # every builder is past its checks before any renames
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            f.write("{}")
        return out_dir
    return write


def test_parallel_callers_build_the_cache_once_and_all_get_it(tmp_path, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    from modelcall.plugins.demo_model import build, demo_model_dir

    calls: list = []
    monkeypatch.setattr(build, "write_demo_model", _fake_writer(calls))
    monkeypatch.setenv("MODELCALL_CACHE_DIR", str(tmp_path))
    with ThreadPoolExecutor(4) as pool:
        dirs = list(pool.map(lambda _: demo_model_dir(), range(4)))
    assert len(set(dirs)) == 1 and len(calls) == 1
    assert os.listdir(dirs[0]) == ["config.json"]
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".demo-model-build-")]


def test_racing_builders_into_one_directory_leave_one_complete_copy(tmp_path, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    from modelcall.plugins.demo_model import build

    calls: list = []
    monkeypatch.setattr(build, "write_demo_model", _fake_writer(calls, threading.Barrier(3, timeout=30)))
    out = str(tmp_path / "model")
    with ThreadPoolExecutor(3) as pool:
        dirs = list(pool.map(lambda _: build_demo_model(out), range(3)))
    assert dirs == [out] * 3 and len(calls) == 3  # no lock here: the rename decides
    assert os.listdir(out) == ["config.json"]
    assert os.listdir(tmp_path) == ["model"]
