"""LoRA refusals and configuration, without a model: what an adapter directory may not hold (each refused with its
reason), the serve flags, the keys file's adapter fields."""
from __future__ import annotations

import argparse
import json

import pytest
import torch
from safetensors.torch import save_file

from keys_util import write_keys
from modelcall.core import ConfigError, InvalidRequest
from modelcall.core.commands import CommandError, add_kernel_options, config_from_args
from modelcall.plugins.auth.keys import KeyStore
from modelcall.plugins.runner.lora_weights import read_adapter

SHAPES = {(0, "q_proj"): (64, 32), (0, "down_proj"): (32, 96)}   # (layer, projection) -> (out, in)


def _adapter(path, r: int = 8, a_in: int = 32, b_out: int = 64, proj: str = "self_attn.q_proj", **config) -> str:
    path.mkdir()
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": r, "lora_alpha": 16, **config}))
    key = f"base_model.model.model.layers.0.{proj}"
    save_file({f"{key}.lora_A.weight": torch.ones(r, a_in), f"{key}.lora_B.weight": torch.ones(b_out, r)},
              str(path / "adapter_model.safetensors"))
    return str(path)


def _read(path: str, max_rank: int = 64):
    return read_adapter("x", path, SHAPES, max_rank, torch.float32, torch.device("cpu"))


def test_a_plain_adapter_loads_with_its_scale_folded_into_b(tmp_path):
    w = _read(_adapter(tmp_path / "a"))
    a, b = w.pairs[(0, "q_proj")]
    assert w.rank == 8 and a.shape == (8, 32) and torch.all(b == 2.0)   # alpha 16 / r 8
    rs = _read(_adapter(tmp_path / "rs", use_rslora=True))
    assert torch.allclose(rs.pairs[(0, "q_proj")][1], torch.full((64, 8), 16 / 8 ** 0.5))


@pytest.mark.parametrize("config, reason", [
    ({"use_dora": True}, "DoRA"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"target_parameters": ["mlp.experts.gate_up_proj"]}, "need a MoE base model"),   # this base has no experts
    ({"target_parameters": ["self_attn.q_proj.weight"]}, "only a MoE layer's fused expert tensors"),
    ({"bias": "all"}, "trained biases"),
    ({"fan_in_fan_out": True}, "fan_in_fan_out"),
    ({"peft_type": "IA3"}, "not LORA"),
])
def test_what_cannot_be_applied_exactly_is_refused_with_the_reason(tmp_path, config, reason):
    with pytest.raises(InvalidRequest, match=reason):
        _read(_adapter(tmp_path / "a", **config))


def test_shapes_rank_and_files_are_checked(tmp_path):
    with pytest.raises(InvalidRequest, match="another base model"):
        _read(_adapter(tmp_path / "shape", a_in=48))
    with pytest.raises(InvalidRequest, match="over --max-lora-rank 4"):
        _read(_adapter(tmp_path / "rank"), max_rank=4)
    with pytest.raises(InvalidRequest, match="embed_tokens|not a LoRA A/B"):
        _read(_adapter(tmp_path / "embed", proj="embed_tokens"))
    with pytest.raises(InvalidRequest, match="no adapter_config.json"):
        _read(str(tmp_path))


def test_serve_flags_become_the_kernel_config():
    parser = argparse.ArgumentParser()
    add_kernel_options(parser)
    cfg = config_from_args(parser.parse_args(["--lora-modules", "a=/x", "b=/y", "--max-loras", "2",
                                              "--max-cpu-loras", "3", "--max-lora-rank", "16",
                                              "--allow-runtime-lora-updates"]))
    assert (cfg.lora_modules, cfg.max_loras, cfg.max_cpu_loras, cfg.max_lora_rank, cfg.runtime_lora_updates) == (
        {"a": "/x", "b": "/y"}, 2, 3, 16, True)
    for bad in (["--lora-modules", "a"], ["--lora-modules", "a=/x", "a=/y"]):
        with pytest.raises(CommandError, match="--lora-modules"):
            config_from_args(parser.parse_args(bad))


def test_keys_file_adapter_fields(tmp_path):
    store = KeyStore.load(write_keys(tmp_path / "k.toml", {
        "k1": {"name": "acme", "private_loras": ["acme-sql"], "permissions": ["admin"]},
        "k2": {"name": "bob", "loras": ["shared"]}}))
    acme, bob = store.verify("k1"), store.verify("k2")
    assert acme.admin and acme.may_use_lora("acme-sql") and acme.may_use_lora("shared")
    assert not bob.admin and not bob.may_use_lora("acme-sql") and bob.may_use_lora("shared")
    assert not bob.may_use_lora("other")
    with pytest.raises(ConfigError, match="private to two keys"):
        KeyStore.load(write_keys(tmp_path / "two.toml", {"k1": {"name": "a", "private_loras": ["x"]},
                                                          "k2": {"name": "b", "private_loras": ["x"]}}))
    with pytest.raises(ConfigError, match="unknown permission"):
        KeyStore.load(write_keys(tmp_path / "perm.toml", {"k1": {"name": "a", "permissions": ["root"]}}))


def test_a_steps_row_indices_are_moved_to_the_activations_device():
    """index_select / index_add_ take their index on the tensor's device: on an accelerator the rows per adapter
    (built on the CPU from the plan) go there once a step ("meta" stands in for it here; on the CPU nothing moves)."""
    from modelcall.plugins.runner.lora_delta import LoraContext

    ctx = LoraContext()
    groups = [(object(), torch.tensor([0, 2])), (object(), torch.tensor([1, 3]))]
    ctx.set(groups, ["a#1", "b#2"], torch.device("meta"))
    assert ctx.batched is not None and ctx.batched.perm.device.type == "meta"
    assert all(rows.device.type == "meta" for _, rows in ctx.groups)
    assert ctx.row_slots(4, torch.device("meta")).device.type == "meta"
    ctx.set(groups, ["a#1", "b#2"], torch.device("cpu"))
    assert ctx.batched.perm.device.type == "cpu" and ctx.groups[0][1] is groups[0][1]
