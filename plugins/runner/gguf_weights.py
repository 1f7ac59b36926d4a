"""A transformers model whose weights come from a GGUF file, quantized tensors kept quantized.

The model's modules are built from its config with every parameter on the meta device (no weight memory, buffers
such as rotary frequencies computed as usual), then each GGUF tensor goes where transformers' GGUF name map says
(gguf's own tensor-name tables):

    linear weights (any GGML type)   -> quant.QuantLinear over the raw blocks (the runner's C kernels read them)
    token embedding                  -> QuantEmbedding: rows dequantized at lookup; the tied lm_head shares it
    norms, biases (F32 in practice)  -> ordinary parameters in the compute dtype

What llama.cpp's converter changed is undone here as transformers' own loader undoes it: Llama-family Q and K rows
are un-permuted (llama.cpp's rope layout; rows are whole blocks, so quantized rows move as bytes) and Gemma's norm
weights are stored as 1 + w. Every model parameter must come from the file; one left over is an error naming it.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator

import numpy as np
import torch

from modelcall.core import ConfigError
from modelcall.plugins.runner import gguf_tensors, heap, quant

log = logging.getLogger("modelcall.runner")

PERMUTED_QK = ("llama", "mistral")        # llama.cpp permutes these families' Q/K rows for its rope
NORM_PLUS_ONE = ("gemma2", "gemma3")      # llama.cpp stores Gemma's RMSNorm weights as 1 + w
FLOAT_TYPES = {0: np.float32, 1: np.float16}   # GGML F32, F16 (BF16 = 30 goes through quant)


class QuantEmbedding(torch.nn.Module):
    """Token embedding over a quantized table: looked-up rows are dequantized (times `scale` when the family scales
    its embeddings, as Gemma's ScaledWordEmbedding does). `qweight` is shared with a tied lm_head."""

    def __init__(self, qweight: quant.QWeight, dtype: torch.dtype, scale: torch.Tensor | None = None) -> None:
        super().__init__()
        self.qweight = qweight
        self.num_embeddings, self.embedding_dim = qweight.shape
        self.dtype = dtype
        self.scale = scale.to(dtype) if scale is not None else None

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        flat = input_ids.reshape(-1)
        out = self.qweight.rows(flat, dtype=self.dtype).view(*input_ids.shape, self.embedding_dim)
        return out * self.scale if self.scale is not None else out


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device and their buffers on the CPU (rotary tables,
    embedding scales are computed at construction and must be real)."""
    original = torch.nn.Module.register_parameter

    def register(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None:
            module._parameters[name] = torch.nn.Parameter(param.to("meta"), requires_grad=False)

    torch.nn.Module.register_parameter = register   # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original   # type: ignore[method-assign]


def load_model(model_dir: str, gguf_path: str, architecture: str, dtype: torch.dtype, attn: str) -> torch.nn.Module:
    """The causal LM of `model_dir`'s config with its weights from `gguf_path`, in `dtype` activations."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    with parameters_on_meta():
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=attn)
    tensors = gguf_tensors.read_tensors(gguf_path)
    names = name_map(model, architecture, int(cfg.num_hidden_layers))
    unknown = []
    for t in tensors.values():
        hf_name = names.get(t.name)
        if hf_name is None:
            unknown.append(t.name)
            continue
        _place(model, hf_name, t, cfg, architecture, dtype)
    if unknown:
        raise ConfigError(f"{gguf_path}: tensors with no place in {type(model).__name__}: {', '.join(unknown[:6])}"
                          f"{' ...' if len(unknown) > 6 else ''}")
    _tie_head(model, cfg)
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise ConfigError(f"{gguf_path}: no tensor for {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}")
    # NOTE: the modules made every parameter on the CPU before parameters_on_meta moved it (1.7 GB of fp32 for Gemma 3
    # 270M, never written), and heap.keep_freed_memory's thresholds keep the freed blocks in malloc's heap. Their pages
    # are handed back here: where malloc's heap gets huge pages (transparent huge pages "always"), the headers written
    # into those blocks made ~120-150 MB of them resident in about half the loads (Gemma's growth 370-405 MB, 252
    # after, under GLIBC_TUNABLES=glibc.malloc.hugetlb=1 with the r16 repack, which trims too, off).
    heap.release_free_memory()
    return model


def name_map(model: torch.nn.Module, architecture: str, num_layers: int) -> dict[str, str]:
    """GGUF tensor name -> the model's parameter name, from gguf's tensor-name tables for `architecture`.

    NOTE: one table for the whole model (transformers' get_gguf_hf_weights_map builds one per submodule: 11 s of a
    135M model's load here); a name the table does not know is tried again without its first part ("model.")."""
    import gguf

    arch = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == architecture), None)
    if arch is None:
        raise ConfigError(f"the gguf package knows no architecture {architecture!r}; upgrade gguf")
    table = gguf.get_tensor_name_map(arch, num_layers)
    out = {}
    for hf_name, _ in model.named_parameters(remove_duplicate=False):
        base, _, suffix = hf_name.rpartition(".")
        found = table.get_name(base) or (table.get_name(base.split(".", 1)[1]) if "." in base else None)
        if found is not None:
            out[f"{found}.{suffix}"] = hf_name
        elif (whole := table.get_name(hf_name)) is not None:   # a bare parameter (gpt-oss's sinks), named .weight
            out[f"{whole}.weight"] = hf_name
    from modelcall.plugins.runner import gguf_experts
    out.update(gguf_experts.name_map(model))   # fused expert parameters: the name tables know only per-expert ones
    return out


def _module(model: torch.nn.Module, hf_name: str) -> tuple[torch.nn.Module, str, str]:
    path, attr = hf_name.rsplit(".", 1)
    return model.get_submodule(path), path, attr


def _raw(t: gguf_tensors.TensorEntry) -> np.ndarray:
    """The tensor's bytes as rows: [rows, bytes per row] (ne[0] values a row), [n bytes] for a vector."""
    if len(t.ne) == 1:
        return t.data
    return t.data.reshape(int(np.prod(t.ne[1:])), -1)


def _permute_rows(rows: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order: per head, rows (0, 2, 4, ..., 1, 3, ...) back to (0, 1, 2, 3, ...)."""
    dim = rows.shape[0] // heads // 2
    return rows.reshape(heads, dim, 2, *rows.shape[1:]).swapaxes(2, 1).reshape(rows.shape)


def _place(model: torch.nn.Module, hf_name: str, t: gguf_tensors.TensorEntry, cfg: Any, arch: str, dtype: torch.dtype) -> None:
    mod, path, attr = _module(model, hf_name)
    qtype = t.qtype
    ne = list(t.ne)          # ne[0]: the input dimension (values per row)
    if len(ne) == 3 or "_exps." in t.name:   # mixture-of-experts tensors and their biases (gguf_experts.py)
        from modelcall.plugins.runner import gguf_experts
        gguf_experts.place(model, hf_name, t, cfg, arch, dtype)
        return
    rows = _raw(t)
    if arch in PERMUTED_QK and (".attn_q." in t.name or ".attn_k." in t.name) and len(ne) == 2:
        heads = cfg.num_attention_heads if ".attn_q." in t.name else cfg.num_key_value_heads
        rows = _permute_rows(rows, heads)
    is_matrix = len(ne) == 2
    if is_matrix and attr == "weight" and isinstance(mod, torch.nn.Linear) and qtype != 0:
        qw = quant.qweight_from_bytes(np.array(rows), qtype, ne[1], ne[0])
        bias = mod.bias if mod.bias is not None and not mod.bias.is_meta else None
        _replace(model, path, quant.QuantLinear(qw, bias))
        return
    if is_matrix and attr == "weight" and isinstance(mod, torch.nn.Embedding) and qtype != 0:
        qw = quant.qweight_from_bytes(np.array(rows), qtype, ne[1], ne[0])
        _replace(model, path, QuantEmbedding(qw, dtype, getattr(mod, "embed_scale", None)))
        return
    value = _dense(rows, qtype, ne)
    if arch in NORM_PLUS_ONE and hf_name.endswith("norm.weight"):
        value = value - 1
    if isinstance(mod, quant.QuantLinear) and attr == "bias":   # a bias placed after its weight's module changed
        mod.bias = torch.nn.Parameter(value.to(dtype), requires_grad=False)
        return
    want = getattr(mod, attr)
    if tuple(want.shape) != tuple(value.shape):
        raise ConfigError(f"GGUF tensor {t.name} has shape {tuple(value.shape)}, {hf_name} wants {tuple(want.shape)}")
    setattr(mod, attr, torch.nn.Parameter(value.to(dtype), requires_grad=False))


def _dense(rows: np.ndarray, qtype: int, ne: list[int]) -> torch.Tensor:
    shape = tuple(reversed(ne))
    if qtype in FLOAT_TYPES:
        return torch.from_numpy(np.ascontiguousarray(rows).view(FLOAT_TYPES[qtype]).astype(np.float32).reshape(shape))
    k = ne[0]
    n = int(np.prod(ne[1:])) if len(ne) > 1 else 1
    qw = quant.qweight_from_bytes(np.array(rows).reshape(n, -1), qtype, n, k)
    return qw.dequantize(torch.float32).reshape(shape)


def _replace(model: torch.nn.Module, path: str, new: torch.nn.Module) -> None:
    parent_path, _, child = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    old = getattr(parent, child)
    if isinstance(old, torch.nn.Linear) and old.bias is not None and new.bias is None:
        # the bias tensor comes later from the file (or is missing: the meta check reports it)
        # assigned, not registered: QuantLinear's `self.bias = None` is a plain attribute register_parameter refuses
        new.bias = torch.nn.Parameter(torch.empty(old.bias.shape, device="meta"), requires_grad=False)
    setattr(parent, child, new)


def _tie_head(model: torch.nn.Module, cfg: Any) -> None:
    """A file without output.weight ties the lm_head to the token embedding (tie_word_embeddings)."""
    head = model.get_output_embeddings()
    if head is None or not any(p.is_meta for p in head.parameters(recurse=False)):
        return
    if not getattr(cfg, "tie_word_embeddings", False):
        raise ConfigError("the GGUF file has no output.weight and the config does not tie embeddings")
    embed = model.get_input_embeddings()
    if isinstance(embed, QuantEmbedding):
        new: torch.nn.Module = quant.QuantLinear(embed.qweight, None)
    else:
        new = torch.nn.Linear(embed.weight.shape[1], embed.weight.shape[0], bias=False, device="meta")
        new.weight = embed.weight
    for name, child in model.named_children():
        if child is head:
            setattr(model, name, new)
            return
    raise ConfigError(f"{type(model).__name__}: lm_head not found among its children")
