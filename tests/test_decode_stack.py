"""The decode stack (plugins/runner/decode_stack.py): a plain decode step over quantized weights runs every layer in one
C call and gives the per-layer Python loop's logits bit for bit (Llama-like layers and Gemma 3's, windows and several
KV groups too); steps it does not cover keep that loop."""
from __future__ import annotations

import pytest
import torch

from test_lean import family_dirs, lockstep_logits, one_thread_after  # noqa: F401 (fixtures)
from test_runner import make_runner

from modelcall.plugins.runner import cpu_kernel, decode_stack, fused_ops, lean, lean_gemma, quant

pytestmark = pytest.mark.skipif(fused_ops.load() is None or cpu_kernel.load() is None, reason="no C compiler here")


def counting(monkeypatch) -> dict[str, int]:
    calls = {"stack": 0}
    run = decode_stack.DecodeStack.run

    def counted(self, *a):
        calls["stack"] += 1
        return run(self, *a)
    monkeypatch.setattr(decode_stack.DecodeStack, "run", counted)
    return calls


@pytest.mark.parametrize("name,dtype,threads,runner", [
    ("llama3", "float32", 1, {}),                              # r16 weights, int16 activations
    ("qwen3", "bfloat16", 2, {}),                              # bf16 rows, Qwen3's head norms, two threads
    ("qwen2", "float32", 1, {"int8_activations": True}),       # qkv bias, llama.cpp's int8 activations
    ("llama3", "float32", 2, {"repack": False}),               # the plain Q8_0 layout
    ("gemma3", "float32", 1, {}),                              # Gemma's four norms, GELU, two KV groups and tables
    ("mistral_window", "float32", 1, {}),                      # an 8-token sliding window
])
def test_the_decode_stack_gives_the_per_layer_loops_logits(name, dtype, threads, runner, family_dirs, monkeypatch):
    model_dir = family_dirs[name]
    one = make_runner(model_dir, dtype=dtype, threads=threads, quantization="q8_0", plugin_config={"runner": runner})
    per_layer = make_runner(model_dir, dtype=dtype, threads=threads, quantization="q8_0",
                            plugin_config={"runner": {**runner, "lean_decode_stack": False}})
    assert one.lean is not None and one.lean.cstack is not None
    assert per_layer.lean is not None and per_layer.lean.cstack is None
    r16 = quant.r16_available() and runner.get("repack", True)
    assert (one.lean.cstack.layers[0].o.qt >= quant.R16_OFF) == bool(r16)
    calls = counting(monkeypatch)
    got = lockstep_logits([one], seed=5)
    assert calls["stack"] >= 3   # decode steps took it; steps with a fresh prompt did not (else all would)
    assert calls["stack"] < len(got)
    assert isinstance(one.lean, lean_gemma.GemmaStack if name == "gemma3" else lean.LeanStack)
    want = lockstep_logits([per_layer], seed=5)
    for step, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a[0], b[0]), f"step {step}: {(a[0] - b[0]).abs().max().item()}"


def test_unquantized_models_have_no_decode_stack(family_dirs):
    runner = make_runner(family_dirs["llama3"], dtype="bfloat16")
    assert isinstance(runner.lean, lean.LeanStack) and runner.lean.cstack is None


def test_no_decode_stack_when_a_library_it_calls_did_not_build(family_dirs, monkeypatch):
    """A library that failed to build (a compile timeout under load, no compiler) leaves the per-layer loop, whose
    linears have their own fallbacks: never a stack holding a null function."""
    monkeypatch.setattr(quant, "load", lambda: None)
    runner = make_runner(family_dirs["llama3"], quantization="q8_0")
    assert runner.lean is not None and runner.lean.cstack is None
