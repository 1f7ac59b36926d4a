"""The `Tokenizer` stage on a Hugging Face fast tokenizer read from a local model directory (or the
directory `--tokenizer` names), with the chat template of `--chat-template FILE` when given.

Encoding and decoding call the Rust `tokenizers` backend directly (the transformers wrapper
adds microseconds per call); transformers renders the chat template.
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from modelcall.core import InvalidRequest, ModelNotFound
from modelcall.plugins.tokenizer_hf.detok import ByteLevelDetokenizer, WindowDetokenizer

# Arguments of transformers' apply_chat_template that would change what it returns or which
# template runs; a request may not set them through chat-template kwargs.
_RESERVED = frozenset({"tokenize", "return_dict", "return_tensors", "padding", "truncation", "max_length",
                       "chat_template", "tokenizer_kwargs", "return_assistant_tokens_mask", "conversation"})


class HFTokenizer:
    """Text ⇄ token ids, chat template and incremental detokenizers for one model directory."""

    def __init__(self, model_dir: str, *, tokenizer_dir: str | None = None, chat_template: str | None = None,
                 name: str | None = None) -> None:
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        if not os.path.isdir(model_dir):
            raise ModelNotFound(f"model directory {model_dir!r} does not exist")
        source = os.path.expanduser(tokenizer_dir) if tokenizer_dir else model_dir
        if not os.path.isdir(source):
            raise ModelNotFound(f"tokenizer directory {tokenizer_dir!r} does not exist")
        template = _read_template(chat_template) if chat_template else None
        # NOTE: with a tokenizer.json, load it as is. AutoTokenizer may swap in a model-specific
        # class that rebuilds the pre-tokenizer (Qwen2Tokenizer does), ignoring the file.
        if os.path.isfile(os.path.join(source, "tokenizer.json")):
            hf = PreTrainedTokenizerFast.from_pretrained(source, local_files_only=True)
        else:
            hf = AutoTokenizer.from_pretrained(source, local_files_only=True)
        backend = getattr(hf, "backend_tokenizer", None)
        if backend is None:
            raise ModelNotFound(f"{source!r} has no fast (tokenizers) tokenizer; convert it to tokenizer.json")
        if template is not None:
            hf.chat_template = template
        _fill_special_tokens(hf, model_dir)   # the model's own config and generation config
        # NOTE: a tokenizer.json may carry padding and truncation (all-MiniLM-L6-v2's: pad to 128, cut at 128);
        # encode() would then pad a prompt with unmasked [PAD]s or cut it silently. Lengths are the kernel's to
        # check (a prompt over the window is refused), so both are off.
        backend.no_padding()
        backend.no_truncation()
        self.hf = hf
        self.backend = backend
        self.name = name or os.path.basename(os.path.normpath(model_dir))   # a hub id, not its snapshot hash
        self.vocab_size: int = len(hf)
        self.eos_token_ids: frozenset[int] = frozenset(_eos_ids(hf, model_dir))
        self.special_token_ids: frozenset[int] = frozenset(
            i for i, t in backend.get_added_tokens_decoder().items() if t.special)
        think = (backend.token_to_id("<think>"), backend.token_to_id("</think>"))
        self.think_token_ids: tuple[int, int] | None = think if None not in think else None  # type: ignore[assignment]
        self._byte_tables = _byte_tables(backend) if _is_byte_level(backend) else None

    # ---- text and ids ---------------------------------------------------------------------

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_pair(self, first: str, second: str) -> list[int]:
        """A text pair with the special tokens between and around them ([CLS] a [SEP] b [SEP]), as a
        cross-encoder reads a query and a document."""
        return self.backend.encode(first, second, add_special_tokens=True).ids

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def token_bytes(self, token_id: int) -> bytes:
        """The token's own bytes (a byte-level token may be part of a UTF-8 character)."""
        if self._byte_tables is not None:
            table = self._byte_tables[False]
            return table[token_id] if 0 <= token_id < len(table) else b""
        tok = self.backend.id_to_token(token_id) or ""
        if len(tok) == 6 and tok.startswith("<0x") and tok.endswith(">"):  # byte fallback (SentencePiece)
            try:
                return bytes([int(tok[3:5], 16)])
            except ValueError:
                pass
        return self.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def detokenizer(self, prompt_token_ids: Sequence[int], *,
                    skip_special_tokens: bool = True) -> ByteLevelDetokenizer | WindowDetokenizer:
        if self._byte_tables is not None:
            return ByteLevelDetokenizer(self._byte_tables[skip_special_tokens])
        return WindowDetokenizer(self.backend, prompt_token_ids, skip_special_tokens)

    # ---- chat -----------------------------------------------------------------------------

    def apply_chat_template(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
                            add_generation_prompt: bool = True, **kwargs: Any) -> str:
        _check_messages(messages, tools)
        reserved = sorted(_RESERVED.intersection(kwargs))
        if reserved:
            raise InvalidRequest(f"chat template arguments {reserved} are not allowed", field="chat_template_kwargs")
        if not self.hf.chat_template:
            raise InvalidRequest(f"model {self.name!r} has no chat template; send a plain prompt instead",
                                 field="messages")
        try:
            text = self.hf.apply_chat_template(messages, tools=tools or None, add_generation_prompt=add_generation_prompt,
                                               tokenize=False, **kwargs)
        except InvalidRequest:
            raise
        except Exception as e:  # jinja errors, raise_exception() in the template, bad shapes
            raise InvalidRequest(f"messages cannot be rendered with the model's chat template: "
                                 f"{type(e).__name__}: {e}", field="messages") from None
        if not isinstance(text, str):
            raise InvalidRequest("the chat template did not render to text", field="messages")
        return text

    def __repr__(self) -> str:
        return f"HFTokenizer({self.name!r}, vocab={self.vocab_size}, eos={sorted(self.eos_token_ids)})"


def _check_messages(messages: Any, tools: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages must be a non-empty list of message objects", field="messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise InvalidRequest(f"messages[{i}] must be an object, got {type(m).__name__}", field="messages")
        if not isinstance(m.get("role"), str):
            raise InvalidRequest(f"messages[{i}] needs a string 'role'", field="messages")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise InvalidRequest("tools must be a list of tool objects", field="tools")


def _read_template(path: str) -> str:
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise ModelNotFound(f"chat template file {path!r} cannot be read ({e.strerror})") from None


def _fill_special_tokens(hf: Any, model_dir: str) -> None:
    """Templates write `{{ bos_token }}` (Llama 3, Gemma, Mistral); a tokenizer_config that does not name
    the token would render it as nothing. Take it from config.json / generation_config.json's ids then."""
    bos = None
    for name in ("config.json", "generation_config.json"):   # the model's config first
        path = os.path.join(model_dir, name)
        if bos is None and os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                bos = json.load(f).get("bos_token_id")
    if hf.bos_token is None and isinstance(bos, int):
        token = hf.convert_ids_to_tokens(bos)
        if token is not None:
            hf.bos_token = token


def _eos_ids(hf: Any, model_dir: str) -> set[int]:
    ids = {hf.eos_token_id} if hf.eos_token_id is not None else set()
    path = os.path.join(model_dir, "generation_config.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            eos = json.load(f).get("eos_token_id")
        ids.update([eos] if isinstance(eos, int) else eos or [])
    return ids


def _is_byte_level(backend: Any) -> bool:
    from tokenizers import decoders
    return isinstance(backend.decoder, decoders.ByteLevel)


def _byte_tables(backend: Any) -> dict[bool, list[bytes]]:
    """Each token's bytes as the ByteLevel decoder produces them: every character mapped back
    through the byte alphabet, or, when one is outside it (added tokens), the token's UTF-8.
    Keyed by skip_special_tokens (special tokens are then empty)."""
    char_to_byte = {c: bytes([b]) for b, c in _bytes_to_unicode().items()}
    size = max(backend.get_vocab_size(with_added_tokens=True),
               max(backend.get_added_tokens_decoder(), default=-1) + 1)
    full: list[bytes] = []
    for i in range(size):
        tok = backend.id_to_token(i)
        if tok is None:
            full.append(b"")
        elif all(c in char_to_byte for c in tok):
            full.append(b"".join(char_to_byte[c] for c in tok))
        else:
            full.append(tok.encode("utf-8"))
    skipped = list(full)
    for i, t in backend.get_added_tokens_decoder().items():
        if t.special:
            skipped[i] = b""
    return {False: full, True: skipped}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte ↔ printable-character alphabet (the ByteLevel pre-tokenizer's)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out
