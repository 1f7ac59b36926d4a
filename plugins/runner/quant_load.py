"""Quantize a loaded safetensors model at load (`--quantization q8_0 | q4_k`), and count resident weight bytes.

Every nn.Linear of the model (the decoder's projections and the lm_head) becomes a quant.QuantLinear over blocks
quantized from its weight, so an HF checkpoint gets a GGUF file's memory and kernels without a conversion step; a
token embedding tied to the lm_head becomes a gguf_weights.QuantEmbedding over the same blocks. Norms, biases and
untied embeddings stay as they are (llama.cpp's q8_0 files keep norms in F32 too).
"""
from __future__ import annotations

import logging

import torch

from modelcall.core import ConfigError
from modelcall.plugins.runner import quant

log = logging.getLogger("modelcall.runner")

SCHEMES = {"q8_0": "Q8_0", "q4_k": "Q4_K"}


def quantize_model(model: torch.nn.Module, scheme: str, device: torch.device) -> int:
    """Replace the model's linears by quantized ones (in place); returns how many."""
    from modelcall.plugins.runner.gguf_weights import QuantEmbedding

    if scheme not in SCHEMES:
        raise ConfigError(f"quantization {scheme!r}: give one of {', '.join(SCHEMES)}")
    if device.type != "cpu":
        raise ConfigError(f"quantization {scheme!r} runs on CPU only (the quantized kernels are C); use device='cpu'")
    qtype = quant.GGML_TYPES[SCHEMES[scheme]]
    embed = model.get_input_embeddings()
    tied = embed.weight if isinstance(embed, torch.nn.Embedding) else None
    done: dict[int, quant.QWeight] = {}
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear:
                continue
            w = child.weight.detach()
            if w.shape[1] % quant.block_info(qtype)[0]:
                log.info("%s: %d inputs are not whole %s blocks; kept as it is", name, w.shape[1], SCHEMES[scheme])
                continue
            key = w.data_ptr()
            if key not in done:
                done[key] = quant.quantize(w.float(), qtype)
            setattr(parent, name, quant.QuantLinear(done[key], child.bias))
            count += 1
    if tied is not None and tied.data_ptr() in done:   # lm_head tied to the embedding: one table for both
        scale = getattr(embed, "embed_scale", None)
        qe = QuantEmbedding(done[tied.data_ptr()], tied.dtype, scale)
        for parent in model.modules():
            for name, child in parent.named_children():
                if child is embed:
                    setattr(parent, name, qe)
    log.info("quantized %d linear layers to %s at load", count, SCHEMES[scheme])
    return count


def resident_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights the model holds: parameters and buffers once each (tied ones once), quantized blocks
    once each (a tied lm_head shares its embedding's)."""
    seen: set[int] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.is_meta or t.untyped_storage().data_ptr() in seen:
            continue
        seen.add(t.untyped_storage().data_ptr())
        total += t.untyped_storage().nbytes()
    for m in model.modules():
        qw = getattr(m, "qweight", None)
        if isinstance(qw, quant.QWeight) and qw.data.data_ptr() not in seen:
            seen.add(qw.data.data_ptr())
            total += qw.nbytes
    return total
