"""GGUF files as model directories: read a file's metadata once and write what the engine's stages read.

A GGUF file holds in one place what a Hugging Face directory spreads over files: hyperparameters, the tokenizer
(vocabulary, merges or scores, special tokens), the chat template, and the tensors (many of them quantized). The
tokenizer, chat template, EOS lists and config are turned, once per file, into a small directory in the user cache

    ~/.cache/modelcall/gguf/<file stem>-<content key>-<path key>/
        config.json              the transformers config the metadata describes (architectures, rope, windows)
        tokenizer.json, ...      the tokenizer transformers' GGUF converter builds from the vocabulary
        generation_config.json   EOS ids (the file's EOS, plus the chat template's end-of-turn token)
        gguf.json                where the weights are: {"gguf_file": absolute path, "architecture", "file_type"}

so the tokenizer plugin, the chat template, records and the prefix cache's model identity see an ordinary model
directory; the runner reads `gguf.json` and takes its weights from the file itself (gguf_weights.py), quantized
tensors kept quantized.

NOTE: the metadata is parsed with the `gguf` package (the format's own reader); the config and tokenizer are
built by transformers' GGUF support (`from_pretrained(..., gguf_file=)`, which reads the same fields), the way
users of transformers load these files. That conversion reads the whole vocabulary in Python (13 s for Gemma 3's
262k tokens here), which is why its result is cached.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

from modelcall.core import ConfigError, ModelNotFound

log = logging.getLogger("modelcall.runner")

MARKER = "gguf.json"
# What the runner serves from GGUF: llama.cpp's architecture name -> the transformers model class it maps to.
# NOTE: every family the runner serves from safetensors that llama.cpp also writes as GGUF. qwen3moe's 3-D expert
# tensors stay quantized, gpt-oss's (MXFP4) are dequantized at load (gguf_experts.py); qwen2moe is refused by name.
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",   # experts kept quantized, one QuantLinear each (gguf_experts.py)
    "gpt-oss": "GptOssForCausalLM",
}
# tensor types the kernels lack that an architecture's expert tensors may have: dequantized at load (gguf_experts.py)
EXPERT_TYPES = {"gpt-oss": {"MXFP4"}}
NOT_YET = {"qwen2moe": "mixture-of-experts tensors with shared experts"}
# Gemma's turn format, for Gemma files that carry no template (the base models): the tokens exist in every Gemma
# vocabulary; written here from the format, system text folded into the first user turn as Gemma's own template does.
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set prefix = messages[0]['content'] + '\\n\\n' -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set prefix = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for m in turns -%}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else 'user') + '\\n' + (prefix if loop.first else '')"
    " + (m['content'] | trim) + '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}")


@dataclass(frozen=True, slots=True)
class GGUFInfo:
    """What the header says, without reading a tensor."""

    path: str
    architecture: str
    name: str
    file_type: int | None
    tensor_types: dict[str, int]    # type name -> how many tensors


def is_gguf(path: str) -> bool:
    """Whether `path` is a file that starts with GGUF's magic."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def find_in_dir(directory: str, gguf_file: str | None = None) -> str | None:
    """The one GGUF file in `directory` (or the one `gguf_file` names there); None when it holds none."""
    if gguf_file:
        path = os.path.join(directory, gguf_file)
        if not is_gguf(path):
            raise ModelNotFound(f"{directory!r} has no GGUF file {gguf_file!r}")
        return path
    found = sorted(n for n in os.listdir(directory) if n.endswith(".gguf"))
    if not found:
        return None
    if len(found) > 1:
        raise ConfigError(f"{directory!r} holds {len(found)} GGUF files ({', '.join(found[:6])}): pick one with "
                          "--gguf-file NAME")
    return os.path.join(directory, found[0])


def read_info(path: str) -> GGUFInfo:
    """The architecture and tensor types of `path` (a ConfigError naming what is not supported)."""
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, OSError) as e:
        raise ConfigError(f"{path}: not a readable GGUF file ({e})") from None
    arch = _field(reader, "general.architecture")
    if not isinstance(arch, str):
        raise ConfigError(f"{path}: no general.architecture in its metadata")
    counts: dict[str, int] = {}
    for t in reader.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    ft = _field(reader, "general.file_type")
    return GGUFInfo(path, arch, str(_field(reader, "general.name") or os.path.basename(path)),
                    int(ft) if ft is not None else None, counts)


def check_supported(info: GGUFInfo, supported_types: set[str]) -> None:
    """One line naming the architecture or tensor type this runner does not serve."""
    if info.architecture in NOT_YET:
        raise ConfigError(f"{info.path}: GGUF architecture {info.architecture!r} is not served yet "
                          f"({NOT_YET[info.architecture]}); supported: {', '.join(sorted(ARCHITECTURES))}")
    if info.architecture not in ARCHITECTURES:
        raise ConfigError(f"{info.path}: GGUF architecture {info.architecture!r} is not supported; supported: "
                          f"{', '.join(sorted(ARCHITECTURES))}")
    bad = sorted(set(info.tensor_types) - supported_types - EXPERT_TYPES.get(info.architecture, set()))
    if bad:
        raise ConfigError(f"{info.path}: tensor type(s) {', '.join(bad)} not supported by the quantized kernels; "
                          f"supported: {', '.join(sorted(supported_types))}")


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    return f.contents() if f is not None else None


def content_key(path: str) -> str:
    """A key for the file's contents: its size and a hash of its first and last 4 MiB (the header with all the
    metadata, and the end of the tensor data), cheap on a file of gigabytes."""
    h = hashlib.sha256()
    size = os.path.getsize(path)
    h.update(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(4 << 20))
        if size > 8 << 20:
            f.seek(size - (4 << 20))
            h.update(f.read())
    return h.hexdigest()[:16]


def cache_root() -> str:
    root = os.environ.get("MODELCALL_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "modelcall")
    return os.path.join(root, "gguf")


def materialize(path: str, supported_types: set[str]) -> str:
    """The model directory for the GGUF file `path` (built on first use, then read from the cache)."""
    path = os.path.abspath(path)
    stem = os.path.basename(path).removesuffix(".gguf")
    key = content_key(path)
    # NOTE: one directory per (contents, path): each one's gguf.json names its own file. Another path to the same
    # contents copies a sibling's converted files (the conversion is the slow part) instead of converting again.
    out = os.path.join(cache_root(), f"{stem}-{key}-{hashlib.sha256(path.encode()).hexdigest()[:8]}")
    marker = os.path.join(out, MARKER)
    if os.path.exists(marker):
        with open(marker, encoding="utf-8") as f:
            m = json.load(f)
        if m.get("gguf_file") == path:   # checked again: a newer runner may serve what an older one refused
            check_supported(GGUFInfo(path, m["architecture"], m.get("name", stem), m.get("file_type"),
                                     m.get("tensor_types", {})), supported_types)
            return out
    sibling = _sibling(key)
    info = read_info(path) if sibling is None else None
    if info is not None:
        check_supported(info, supported_types)
    os.makedirs(cache_root(), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_root()) as tmp:
        if sibling is not None:
            shutil.copytree(sibling, tmp, dirs_exist_ok=True)
            with open(os.path.join(tmp, MARKER), encoding="utf-8") as f:
                m = json.load(f)
            info = GGUFInfo(path, m["architecture"], m.get("name", stem), m.get("file_type"), m.get("tensor_types", {}))
            check_supported(info, supported_types)
            m["gguf_file"] = path
            with open(os.path.join(tmp, MARKER), "w", encoding="utf-8") as f:
                json.dump(m, f, indent=1)
        else:
            _write_dir(path, info, tmp)
        if os.path.isdir(out):   # a stale or half-written build: replace it
            shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
        os.makedirs(tmp)   # TemporaryDirectory removes its own name on exit
    log.info("GGUF %s (%s, %s) described in %s", path, info.architecture, _types_line(info), out)
    return out


def _sibling(key: str) -> str | None:
    """A converted directory of the same contents (another path to the file), if one is complete."""
    root = cache_root()
    if not os.path.isdir(root):
        return None
    for name in os.listdir(root):
        if f"-{key}-" in name and os.path.exists(os.path.join(root, name, MARKER)):
            return os.path.join(root, name)
    return None


def _types_line(info: GGUFInfo) -> str:
    return " ".join(f"{n} x{c}" for n, c in sorted(info.tensor_types.items(), key=lambda kv: -kv[1]))


def _write_dir(path: str, info: GGUFInfo, out: str) -> None:
    from transformers import GenerationConfig

    from modelcall.plugins.runner import gguf_config

    name = os.path.basename(path)
    cfg = gguf_config.load_config(path, info.architecture)   # transformers' reader, and what it leaves out
    cfg.architectures = [ARCHITECTURES[info.architecture]]
    cfg.dtype = "float32"   # activations: the quantized kernels take and give fp32 (runner.quant)
    tok = gguf_config.load_tokenizer(path, info.architecture)
    if not tok.chat_template and info.architecture.startswith("gemma"):
        tok.chat_template = GEMMA_TEMPLATE
        log.info("%s carries no chat template: Gemma's turn format is used", name)
    eos = [cfg.eos_token_id] if isinstance(cfg.eos_token_id, int) else list(cfg.eos_token_id or [])
    for marker in ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|end|>"):
        tid = tok.convert_tokens_to_ids(marker)
        if tok.chat_template and marker in tok.chat_template and isinstance(tid, int) and tid != tok.unk_token_id \
                and tid not in eos:
            eos.append(tid)   # the turn's end stops a chat turn, as the model's own generation config says
    cfg.eos_token_id = eos[0] if len(eos) == 1 else eos
    cfg.save_pretrained(out)
    tok.save_pretrained(out)
    GenerationConfig(eos_token_id=cfg.eos_token_id, bos_token_id=cfg.bos_token_id,
                     pad_token_id=cfg.pad_token_id).save_pretrained(out)
    with open(os.path.join(out, MARKER), "w", encoding="utf-8") as f:
        json.dump({"gguf_file": path, "architecture": info.architecture, "file_type": info.file_type,
                   "tensor_types": info.tensor_types, "name": info.name}, f, indent=1)


def marker_of(model_dir: str) -> dict[str, Any] | None:
    """The GGUF pointer of a materialized directory, or None for an ordinary model directory."""
    p = os.path.join(model_dir, MARKER)
    if not os.path.exists(p):
        return None
    with open(p, encoding="utf-8") as f:
        m = json.load(f)
    if not os.path.exists(m.get("gguf_file", "")):
        raise ModelNotFound(f"{model_dir}: its GGUF file {m.get('gguf_file')!r} is gone; give the file again")
    return m
