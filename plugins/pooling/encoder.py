"""EncoderRunner: a BERT-family encoder (bidirectional attention, no KV cache) run with transformers' own
modules on the kernel's batches. It only pools: a pooling request's prompt is encoded whole, at once, in the
step where its last chunk is scheduled, batched (padded, with an attention mask) with the other prompts that
end in that step.

NOTE: bidirectional attention makes every state depend on the whole prompt, so a chunk before the last computes
nothing here (the scheduler's chunking still meters and admits it as usual); a step's compute is then the sum
of its ending prompts, which may exceed max_num_batched_tokens by up to one window per prompt.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

import torch

from modelcall.core import ConfigError, KernelConfig, ModelSpec, SchedulePlan, StepOutput
from modelcall.plugins.pooling import cpu_gemm, packed_bert

# model_type values of the encoder families this runner serves through transformers' AutoModel
ENCODER_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "distilbert", "modernbert", "electra", "mpnet",
                           "nomic_bert", "camembert"})

# RoBERTa's families number positions from pad_token_id + 1 (fairseq's make_positions), so each holds that many
# fewer tokens than its max_position_embeddings
OFFSET_POSITIONS = frozenset({"roberta", "xlm-roberta", "camembert"})


def model_type(model_dir: str) -> str:
    try:
        with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
            return str(json.load(f).get("model_type", ""))
    except (OSError, ValueError):
        return ""


class EncoderRunner:
    """Encodes whole prompts; refuses sampling (the entry pipeline refuses generation before it gets here)."""

    generates = False

    def __init__(self, config: KernelConfig, model_dir: str, max_seq_length: int | None = None) -> None:
        from transformers import AutoConfig, AutoModel

        if config.threads:
            torch.set_num_threads(config.threads)
        device = torch.device(config.device if config.device not in (None, "auto") else
                              ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = {"auto": None, None: None, "float32": torch.float32, "bfloat16": torch.bfloat16,
                 "float16": torch.float16}.get(config.dtype, False)
        if dtype is False:
            raise ConfigError(f"dtype {config.dtype!r}: the encoder runner takes auto, float32, bfloat16 or float16")
        dtype = dtype or cpu_gemm.auto_dtype(device)   # auto: bf16 where the CPU has bf16 dot products
        hf = AutoConfig.from_pretrained(model_dir, local_files_only=True)
        # A sequence-classification checkpoint (a cross-encoder) scores: its head's logits are the pooled rows
        self.classifies = any(a.endswith("ForSequenceClassification") for a in getattr(hf, "architectures", None) or ())
        auto = AutoModel
        if self.classifies:
            from transformers import AutoModelForSequenceClassification as auto
        self.model = auto.from_pretrained(model_dir, local_files_only=True, dtype=dtype).to(device).eval()
        self.num_labels = int(getattr(hf, "num_labels", 1)) if self.classifies else 0
        # NOTE: a pair's second text has token type 1 (BERT's segment B): after the first [SEP]
        self.sep_id = _sep_id(model_dir) if self.classifies and int(getattr(hf, "type_vocab_size", 1) or 1) > 1 else None
        self.model.requires_grad_(False)
        self.device, self.dtype = device, dtype
        self.pad_id = int(getattr(hf, "pad_token_id", None) or 0)
        max_len = int(getattr(hf, "max_position_embeddings", 512))
        if hf.model_type in OFFSET_POSITIONS:   # positions are numbered from pad_token_id + 1: 514 hold 512 tokens
            max_len -= int(getattr(hf, "pad_token_id", None) or 0) + 1
        if max_seq_length:
            max_len = min(max_len, int(max_seq_length))   # sentence-transformers' own limit (it would truncate)
        if config.max_model_len is not None:
            if config.max_model_len > max_len:
                raise ConfigError(f"max_model_len {config.max_model_len} exceeds the encoder's {max_len} tokens")
            max_len = config.max_model_len
        heads = int(hf.num_attention_heads)
        self.hidden_size = int(hf.hidden_size)
        self.spec = ModelSpec(
            name=config.served_model_name or os.path.basename(os.path.normpath(model_dir)), max_model_len=max_len,
            vocab_size=int(hf.vocab_size), num_layers=int(hf.num_hidden_layers), num_kv_heads=heads,
            head_dim=self.hidden_size // heads, dtype=str(dtype).removeprefix("torch."), device=str(device),
            identity=hashlib.sha256(f"encoder:{os.path.realpath(model_dir)}".encode()).hexdigest()[:32])
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        # NOTE: after weight_bytes: a packed weight is no parameter of the module (the count is the same bytes).
        # A BERT on the CPU runs on packed rows (packed_bert: no padding, one QKV GEMM, attention in C); any other
        # encoder keeps transformers' modules with their linears packed.
        self.packed = packed_bert.build(self.model) if device.type == "cpu" and not self.classifies else None
        self.packed_linears = cpu_gemm.pack_cpu_linears(self.model) if device.type == "cpu" and not self.packed else 0

    def kv_block_bytes(self, block_size: int) -> int:
        # NOTE: nothing is cached; the pool's blocks only meter admission, sized as a decoder's would be
        s = self.spec
        return 2 * s.num_layers * block_size * s.num_kv_heads * s.head_dim * 4

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size

    def execute(self, plan: SchedulePlan) -> StepOutput:
        t0 = time.perf_counter()
        ending = []
        for i, c in enumerate(plan.chunks):
            req = c.request
            if c.sample or req.pooling is None:
                raise RuntimeError(f"{req.request_id}: the encoder runner only pools (it generates no tokens)")
            if req.num_computed_tokens + c.num_new_tokens == req.num_prompt_tokens:
                ending.append((i, req))
        pooled = {}
        if self.packed is not None and ending:
            pooled = self._encode_packed(ending)
        else:
            for group in length_groups([r.num_prompt_tokens for _, r in ending]):
                pooled.update(self._encode([ending[g] for g in group]))
        return StepOutput(token_ids=[None] * len(plan.chunks), pooled=pooled or None,
                          forward_s=time.perf_counter() - t0)

    def _encode(self, ending: list[tuple[int, Any]]) -> dict[int, torch.Tensor]:
        width = max(r.num_prompt_tokens for _, r in ending)
        ids = torch.full((len(ending), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(ending), width), dtype=torch.long)
        for b, (_, r) in enumerate(ending):
            n = r.num_prompt_tokens
            ids[b, :n] = torch.tensor(r.all_token_ids[:n])
            mask[b, :n] = 1
        kw = {}
        if self.sep_id is not None:
            first_sep = (ids == self.sep_id).int().cumsum(1)
            kw["token_type_ids"] = ((first_sep - (ids == self.sep_id).int()) > 0).long() * mask
        with torch.inference_mode():
            out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                             **{k: v.to(self.device) for k, v in kw.items()})
        if self.classifies:
            logits = out.logits.float().cpu()
            return {i: logits[b:b + 1] for b, (i, _) in enumerate(ending)}
        hidden = out.last_hidden_state.float().cpu()
        out = {}
        for b, (i, r) in enumerate(ending):
            n = r.num_prompt_tokens
            out[i] = hidden[b, :n] if r.pooling.every_token else hidden[b, n - 1:n]
        return out

    def _encode_packed(self, ending: list[tuple[int, Any]]) -> dict[int, torch.Tensor]:
        """Every ending prompt in one forward on packed rows: each computed on its own tokens only, whatever the
        others' lengths (no padding, so no length groups)."""
        lengths = [r.num_prompt_tokens for _, r in ending]
        ids = torch.tensor([t for _, r in ending for t in r.all_token_ids[:r.num_prompt_tokens]], dtype=torch.long)
        positions = torch.cat([torch.arange(n) for n in lengths])
        cu_seqlens = torch.tensor([0, *lengths], dtype=torch.long).cumsum(0)
        hidden = self.packed.forward(ids, positions, torch.zeros_like(ids), cu_seqlens).float()
        out = {}
        for b, (i, r) in enumerate(ending):
            start, end = int(cu_seqlens[b]), int(cu_seqlens[b + 1])
            out[i] = hidden[start:end] if r.pooling.every_token else hidden[end - 1:end]
        return out

    def close(self) -> None:
        self.model = self.packed = None  # type: ignore[assignment]


PAD_SHARE = 0.25   # the most of a padded batch's tokens that may be padding before the prompts are split


def length_groups(lengths: list[int]) -> list[list[int]]:
    """The indices of `lengths` (the prompts ending in one step) in batches to encode one after another: sorted by
    length, a batch grows while its padding stays within PAD_SHARE of its padded tokens.

    NOTE: the step's prompts vary in length as they arrive (a RAG corpus's chunks do), and one batch padded to the
    longest computes every short prompt at the longest's width, attention included; sentence-transformers sorts by
    length for the same reason. Fewer, wider batches keep the GEMMs large: equal lengths stay one batch."""
    groups: list[list[int]] = []
    rows: list[int] = []
    real = 0
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        n = lengths[i]   # the batch's width, were prompt i added (sorted: the longest so far)
        if rows and n * (len(rows) + 1) - (real + n) > PAD_SHARE * n * (len(rows) + 1):
            groups.append(rows)
            rows, real = [], 0
        rows.append(i)
        real += n
    if rows:
        groups.append(rows)
    return groups


def _sep_id(model_dir: str) -> int | None:
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(model_dir, local_files_only=True).sep_token_id
