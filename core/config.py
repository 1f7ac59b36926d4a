"""Kernel configuration: which model, which stage implementations, and the engine's limits."""
from __future__ import annotations

import msgspec

from modelcall.core.errors import ConfigError


class KernelConfig(msgspec.Struct, kw_only=True):
    """Everything a kernel needs to assemble itself. Unknown keys in `plugin_config` are the plugins' own.

    Stage names (`tokenizer`, `runner`, `scheduler`, `kv_cache`, `sampler`) pick an
    implementation: "auto" lets the first plugin that accepts win (installed plugins before
    built-ins); a name asks for that implementation and the others decline. `eviction_policy`
    and `waiting_queue` pick, the same way, the order the KV policy evicts in and the order the
    scheduler admits in (`core/policies.py`).
    """

    model: str | None = None            # a Hugging Face model directory, a GGUF file (or a directory holding one),
                                        # a hub id (org/name); None: the default model (SmolLM2-135M-Instruct, GGUF)
    gguf_file: str | None = None        # which GGUF file of a directory or hub snapshot holding several
    quantization: str | None = None     # safetensors weights quantized at load: q8_0 | q4_k (None: as stored)
    revision: str | None = None         # hub id only: branch, tag or commit (default: main)
    download_dir: str | None = None     # hub id only: the cache folder (default: HF_HUB_CACHE or HF_HOME/hub)
    tokenizer_dir: str | None = None    # load the tokenizer from here instead of the model directory
    chat_template: str | None = None    # a Jinja chat template file that replaces the model's own
    served_model_name: str | None = None
    dtype: str = "auto"                 # auto | float32 | bfloat16 | float16
    kv_cache_dtype: str = "auto"        # auto: same as dtype on CUDA, bfloat16 KV on CPU for bf16 and GGUF; float32,
                                        # bfloat16, float16, or on CPU fp8 (= fp8_e4m3) / fp8_e5m2 (lossy, 1 byte)
    device: str = "auto"                # auto | cpu | cuda | cuda:N
    threads: int | None = None          # torch intra-op threads on CPU; None leaves torch's choice
    max_model_len: int | None = None    # context window; None: the model's own
    block_size: int = 16
    num_kv_blocks: int | None = None    # None: sized from kv_cache_memory_gb
    kv_cache_memory_gb: float = 1.0
    enable_prefix_caching: bool = True
    # KV tiers behind the pool (docs/kv-cache.md): host RAM for evicted blocks, then a directory that outlives the
    # process (one file per block, checked against the model's fingerprint before any is loaded); off by default.
    kv_cache_host_gb: float = 0.0
    kv_cache_dir: str | None = None
    kv_cache_disk_gb: float = 16.0      # the directory's bound for this model: least recently used blocks go first
    kv_cache_fsync: str = "never"       # never | always (fsync each block file and the folder; see docs/kv-cache.md)
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048  # token budget of one step, shared by decodes and prefill chunks
    max_queued: int = 1024
    # Entry caps: over one, a request gets a 400 naming the cap (one call must not fill the queue).
    max_messages: int = 512             # chat messages per request
    max_tools: int = 128                # tool definitions per request
    max_stop_strings: int = 16          # stop strings per request (SamplingParams also allows at most 16)
    max_stop_length: int = 256          # characters per stop string
    max_sequences_per_call: int = 64    # sequences one client call may start (prompts × n); a pooling call's in flight
    scheduling_policy: str = "fcfs"     # fcfs | priority | fair (priority first, then tokens served per tenant)
    stream_capacity: int = 64
    consumer_timeout_s: float = 60.0    # a stream whose consumer lags this long is aborted
    tokenizer: str = "auto"
    runner: str = "auto"
    scheduler: str = "auto"
    kv_cache: str = "auto"
    sampler: str = "auto"
    eviction_policy: str = "auto"       # built-in: lru
    waiting_queue: str = "auto"         # built-in: default (the order scheduling_policy names)
    # vLLM's --speculative-config: {"method": "ngram" | "suffix", "num_speculative_tokens": k, ...}
    # (core/speculative.py); None: speculation off.
    speculative_config: dict | None = None
    # vLLM's --async-scheduling: step N's output stage runs while step N+1's forward computes
    # (core/engine.py, a mode of Engine._step); stops and aborts land one step late, the extra token dropped.
    # Off by default: not yet shown a gain on 2 shared cores (W1 on and off, 2026-12-01: docs/benchmarks.md;
    # w2_serve_vs_vllm.sh).
    async_scheduling: bool = False
    # Decode bursts (core/burst.py), vLLM's --num-scheduler-steps: a pure-decode plan whose requests nothing
    # stale would change runs up to this many steps in one runner call when no request waits, as many as fit
    # burst_budget_ms at the last step's time (tokens reach clients at most that late, arrivals wait at most that
    # long). 1: off; off too with speculative decoding (its drafts are proposed step by step). The runner caps it
    # (the CPU decode path only; 1 elsewhere).
    num_scheduler_steps: int = 32
    burst_budget_ms: float = 100.0
    # Multi-LoRA (docs/lora.md), vLLM's flags: PEFT adapter directories served beside the base model, picked by a
    # request's `model`; max_loras: distinct adapters in one step; max_cpu_loras: adapters kept loaded (least
    # recently used evicted, reloaded from disk when asked again; None: every registered one); max_lora_rank: a
    # larger rank is refused at load; runtime_lora_updates: POST /v1/load_lora_adapter and /v1/unload_lora_adapter
    # (keys with the admin permission only). LoRA is on when lora_modules is not empty or runtime updates are.
    lora_modules: dict[str, str] = {}
    max_loras: int = 8
    max_cpu_loras: int | None = None
    max_lora_rank: int = 64
    runtime_lora_updates: bool = False
    plugin_config: dict[str, dict] = {}

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ConfigError(f"block_size must be a power of two, got {self.block_size}")
        if self.max_num_seqs < 1:
            raise ConfigError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.num_scheduler_steps < 1 or not self.burst_budget_ms >= 0:
            raise ConfigError(f"num_scheduler_steps must be >= 1 and burst_budget_ms >= 0, got "
                              f"{self.num_scheduler_steps}, {self.burst_budget_ms}")
        if self.max_num_batched_tokens < 1:
            raise ConfigError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        for cap in ("max_messages", "max_tools", "max_stop_strings", "max_stop_length", "max_sequences_per_call"):
            if getattr(self, cap) < 1:
                raise ConfigError(f"{cap} must be >= 1, got {getattr(self, cap)}")
        if self.scheduling_policy not in ("fcfs", "priority", "fair"):
            raise ConfigError(f"scheduling_policy must be fcfs, priority or fair, got {self.scheduling_policy!r}")
        if self.max_loras < 1 or self.max_lora_rank < 1 or (self.max_cpu_loras is not None and self.max_cpu_loras < 1):
            raise ConfigError(f"max_loras, max_lora_rank and max_cpu_loras must be >= 1, got {self.max_loras}, "
                              f"{self.max_lora_rank}, {self.max_cpu_loras}")
        if self.speculative_config:
            from modelcall.core.speculative import parse_config
            parse_config(self.speculative_config)  # refuse a bad one at start-up

    @property
    def lora_enabled(self) -> bool:
        return bool(self.lora_modules) or self.runtime_lora_updates

    def wants(self, stage: str, name: str) -> bool:
        """True when configuration leaves `stage` open or names `name` for it (for provider hooks)."""
        chosen = getattr(self, stage)
        return chosen in ("auto", name)
