"""Hub ids: `--model org/name` is served from huggingface_hub's cache layout (refs, snapshots, blobs),
honouring HF_HUB_CACHE / HF_HOME / --download-dir / --revision, sharded safetensors included; offline and
not cached is one clear line naming the id and what to do. The network is never touched (HF_HUB_OFFLINE=1).
"""
from __future__ import annotations

import hashlib
import os

import pytest
from family_models import build_family

from modelcall.core import ModelNotFound

pytestmark = pytest.mark.anyio

PROMPT = [11, 523, 88, 1400, 97, 5, 1203, 640, 77, 31]


def write_hub_cache(cache: str, repo: str, model_dir: str, refs: tuple[str, ...] = ("main",)) -> str:
    """Lay `model_dir`'s files out as huggingface_hub does: blobs by hash, a snapshot of symlinks to them,
    refs naming the snapshot's commit. Returns the commit."""
    root = os.path.join(cache, "models--" + repo.replace("/", "--"))
    commit = hashlib.sha1(f"{repo}:{sorted(os.listdir(model_dir))}:{model_dir}".encode()).hexdigest()
    snap = os.path.join(root, "snapshots", commit)
    os.makedirs(os.path.join(root, "blobs"), exist_ok=True)
    os.makedirs(snap, exist_ok=True)
    for name in os.listdir(model_dir):
        data = open(os.path.join(model_dir, name), "rb").read()
        blob = os.path.join(root, "blobs", hashlib.sha256(data).hexdigest())
        with open(blob, "wb") as f:
            f.write(data)
        os.symlink(os.path.relpath(blob, snap), os.path.join(snap, name))
    os.makedirs(os.path.join(root, "refs"), exist_ok=True)
    for ref in refs:
        with open(os.path.join(root, "refs", ref), "w") as f:
            f.write(commit)
    return commit


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, demo_model_dir) -> dict[str, str]:
    """Two tiny Llama checkpoints (different weights), saved in shards with their index."""
    import torch
    from transformers import AutoModelForCausalLM

    out = {}
    for seed in (0, 1):
        d = build_family("llama3", str(tmp_path_factory.mktemp(f"llama{seed}")), demo_model_dir, seed=seed)
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
        for f in os.listdir(d):
            if f.endswith(".safetensors"):
                os.remove(os.path.join(d, f))
        model.save_pretrained(d, max_shard_size="200KB")
        out[f"seed{seed}"] = d
    assert os.path.exists(os.path.join(out["seed0"], "model.safetensors.index.json"))
    return out


def _reference(model_dir: str) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([PROMPT])
    gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return gen[0, len(PROMPT):].tolist()


@pytest.fixture
def offline_env(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-home"))
    return monkeypatch


async def _greedy(make_kernel, **config) -> tuple[str, list[int]]:
    async with make_kernel(dtype="float32", **config) as kernel:
        done = await kernel.complete(prompt_token_ids=PROMPT, max_tokens=8, temperature=0, ignore_eos=True)
        return kernel.model_name, done.token_ids


async def test_hub_id_is_served_from_the_cache_in_hf_hub_cache(make_kernel, checkpoints, offline_env, tmp_path):
    cache = str(tmp_path / "hub")
    write_hub_cache(cache, "acme/tiny-llama", checkpoints["seed0"])
    offline_env.setenv("HF_HUB_CACHE", cache)
    name, ids = await _greedy(make_kernel, model="acme/tiny-llama")
    assert name == "acme/tiny-llama"   # served under its id, not its snapshot hash
    async with make_kernel(model="acme/tiny-llama") as kernel:
        assert kernel.tokenizer.name == "acme/tiny-llama"
    assert ids == _reference(checkpoints["seed0"])


async def test_hf_home_download_dir_and_revision_pick_the_snapshot(make_kernel, checkpoints, offline_env, tmp_path):
    home = tmp_path / "home"
    write_hub_cache(str(home / "hub"), "acme/tiny-llama", checkpoints["seed0"])
    offline_env.setenv("HF_HOME", str(home))
    _, from_home = await _greedy(make_kernel, model="acme/tiny-llama")
    assert from_home == _reference(checkpoints["seed0"])

    other = str(tmp_path / "elsewhere")
    commit = write_hub_cache(other, "acme/tiny-llama", checkpoints["seed1"], refs=("main", "v2"))
    want = _reference(checkpoints["seed1"])
    assert want != from_home   # different weights: the test can tell which snapshot was served
    for revision in (None, "v2", commit):
        _, ids = await _greedy(make_kernel, model="acme/tiny-llama", download_dir=other, revision=revision)
        assert ids == want, revision


async def test_offline_and_not_cached_is_one_line_naming_the_id(make_kernel, offline_env):
    with pytest.raises(ModelNotFound) as e:
        async with make_kernel(model="acme/not-downloaded"):
            pass
    message = str(e.value)
    assert "acme/not-downloaded" in message and "HF_HUB_OFFLINE" in message and "huggingface-cli download" in message
    assert "\n" not in message


async def test_unknown_revision_of_a_cached_model_is_refused(make_kernel, checkpoints, offline_env, tmp_path):
    cache = str(tmp_path / "hub")
    write_hub_cache(cache, "acme/tiny-llama", checkpoints["seed0"])
    with pytest.raises(ModelNotFound, match="acme/tiny-llama@v9"):
        async with make_kernel(model="acme/tiny-llama", download_dir=cache, revision="v9"):
            pass


def test_cli_prints_the_one_line_and_exits_2(capsys, offline_env):
    from modelcall.plugins.cli.main import main

    assert main(["generate", "--model", "acme/nothing", "--prompt", "hello"]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("modelcall: error:")]
    assert len(lines) == 1 and "acme/nothing" in lines[0] and "HF_HUB_OFFLINE" in lines[0], err
