"""The command toolkit: kernel options shared by every subcommand that starts a kernel (generate, serve,
bench, agent ...), whichever plugin registers it (`register_commands`).

    def configure(parser):
        add_kernel_options(parser)
        parser.add_argument(...)

    async def run(args):
        async with kernel_from_args(args) as kernel:
            ...

`--plugin` and `-p no:NAME` are global options (before the subcommand); `kernel_from_args`
hands them to the kernel so it sees the same plugins the command line did.

It lives in core, not in the CLI plugin, so a plugin's command depends on a core seam and never on
another plugin's internals (argparse and json only: nothing heavy is imported).
"""
from __future__ import annotations

import argparse
import json
from typing import Any

from modelcall.core import ConfigError, Kernel, KernelConfig

STAGES = ("tokenizer", "runner", "scheduler", "kv_cache", "sampler", "eviction_policy", "waiting_queue")


class CommandError(Exception):
    """A user error in a subcommand: printed as one line on stderr, exit status `code`."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def add_kernel_options(parser: argparse.ArgumentParser) -> None:
    """Add the options that configure a kernel (model, device, limits, stage choice).

    Front-end limits (served model name, queue length) are left to the commands that need them;
    `config_from_args` picks them up when a command defines `served_model_name` or `max_queued`.
    """
    d = KernelConfig()
    g = parser.add_argument_group("model and engine")
    g.add_argument("--model", metavar="DIR|FILE.gguf|ORG/NAME",
                   help="Hugging Face model directory, GGUF file, hub id, or a built-in name: smollm2, gemma3-270m, "
                        "trained (the tool demo), random (default: smollm2, SmolLM2-135M-Instruct)")
    g.add_argument("--gguf-file", metavar="NAME", help="which GGUF file of a directory or hub snapshot holding several")
    g.add_argument("--quantization", choices=["q8_0", "q4_k"],
                   help="quantize a safetensors model's linear weights at load (default: keep them as stored)")
    g.add_argument("--revision", help="hub id only: branch, tag or commit (default: main)")
    g.add_argument("--download-dir", metavar="DIR", help="hub id only: cache folder (default: HF_HUB_CACHE or HF_HOME/hub)")
    g.add_argument("--tokenizer", dest="tokenizer_dir", metavar="DIR",
                   help="load the tokenizer from DIR instead of the model directory")
    g.add_argument("--chat-template", metavar="FILE", help="a Jinja chat template that replaces the model's own")
    g.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], help="default: auto")
    g.add_argument("--kv-cache-dtype",
                   choices=["auto", "float32", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"],
                   help="default: auto (fp8: one byte per cached value, CPU only, lossy)")
    g.add_argument("--device", help="auto, cpu, cuda or cuda:N (default: auto)")
    g.add_argument("--threads", type=_positive_int, metavar="N", help="torch threads on CPU")
    g.add_argument("--max-model-len", type=_positive_int, metavar="N", help="context window (default: the model's)")
    g.add_argument("--block-size", type=_positive_int, metavar="N", help=f"tokens per KV block (default: {d.block_size})")
    g.add_argument("--kv-cache-gb", type=_positive_float, metavar="GB",
                   help=f"memory for the KV cache (default: {d.kv_cache_memory_gb})")
    g.add_argument("--num-kv-blocks", type=_positive_int, metavar="N", help="KV blocks (overrides --kv-cache-gb)")
    g.add_argument("--no-prefix-caching", action="store_true", help="do not reuse KV blocks of common prefixes")
    g.add_argument("--kv-cache-host-gb", type=_positive_float, metavar="GB",
                   help="host RAM for KV blocks evicted from the pool, read back on a prefix hit (default: off)")
    g.add_argument("--kv-cache-dir", metavar="DIR",
                   help="keep prefix-cache blocks in DIR across evictions and restarts (docs/kv-cache.md; default: off)")
    g.add_argument("--kv-cache-disk-gb", type=_positive_float, metavar="GB",
                   help=f"bound of --kv-cache-dir for this model, least recently used out first (default: {d.kv_cache_disk_gb})")
    g.add_argument("--kv-cache-fsync", choices=["never", "always"],
                   help="fsync each block file written to --kv-cache-dir (default: never; a checksum catches torn files)")
    g.add_argument("--max-num-seqs", type=_positive_int, metavar="N",
                   help=f"requests computed per step (default: {d.max_num_seqs})")
    g.add_argument("--max-num-batched-tokens", type=_positive_int, metavar="N",
                   help=f"token budget of one step (default: {d.max_num_batched_tokens})")
    g.add_argument("--scheduling-policy", "--scheduling", choices=["fcfs", "priority", "fair"],
                   help="default: fcfs; fair: priority first, then the tenant (API key) served the fewest tokens "
                        "(docs/tenancy.md)")
    g.add_argument("--speculative-config", metavar="JSON",
                   help='speculative decoding as vLLM\'s JSON, e.g. {"method": "ngram", "num_speculative_tokens": 5, '
                        '"prompt_lookup_max": 4, "prompt_lookup_min": 1} or {"method": "suffix"} (default: off)')
    g.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="post-process step N while step N+1's forward runs (default: "
                        f"{'on' if d.async_scheduling else 'off'})")
    g.add_argument("--num-scheduler-steps", type=_positive_int, metavar="N",
                   help="decode bursts: up to N decode steps per runner call when no request waits, as many as fit "
                        f"--burst-budget-ms (default: {d.num_scheduler_steps}; 1: off)")
    g.add_argument("--burst-budget-ms", type=float, metavar="MS",
                   help=f"the longest a decode burst may run (default: {d.burst_budget_ms:g})")
    g.add_argument("--stage", action="append", default=[], metavar="STAGE=NAME",
                   help=f"pick the implementation of a stage ({', '.join(STAGES)}); repeatable")
    g.add_argument("--plugin-config", action="append", default=[], metavar="PLUGIN=JSON",
                   help="a JSON object of settings for one plugin; repeatable")
    lo = parser.add_argument_group("LoRA adapters (docs/lora.md)")
    lo.add_argument("--lora-modules", nargs="+", default=None, metavar="NAME=DIR",
                    help="PEFT adapter directories served on the model; a request's `model` picks one by NAME")
    lo.add_argument("--max-loras", type=_positive_int, metavar="N", help=f"adapters in one step (default: {d.max_loras})")
    lo.add_argument("--max-cpu-loras", type=_positive_int, metavar="N",
                    help="adapters kept loaded, least recently used evicted (default: all)")
    lo.add_argument("--max-lora-rank", type=_positive_int, metavar="R",
                    help=f"larger ranks are refused at load (default: {d.max_lora_rank})")
    lo.add_argument("--allow-runtime-lora-updates", action="store_true",
                    help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (keys with the admin "
                         "permission only)")
    c = parser.add_argument_group("entry caps (over one: 400)")
    for flag, what in (("messages", "chat messages per request"), ("tools", "tool definitions per request"),
                       ("stop-strings", "stop strings per request"), ("stop-length", "characters per stop string"),
                       ("sequences-per-call", "sequences one call may start (prompts x n)")):
        field = "max_" + flag.replace("-", "_")
        c.add_argument(f"--max-{flag}", type=_positive_int, metavar="N", dest=field,
                       help=f"{what} (default: {getattr(d, field)})")
    t = parser.add_argument_group("traces")
    t.add_argument("--otlp-traces-endpoint", metavar="URL",
                   help="export a trace per model request over OTLP/HTTP, e.g. http://127.0.0.1:4318/v1/traces")
    t.add_argument("--otlp-capture-content", action="store_true",
                   help="put prompt and output text in the spans (gen_ai.input/output.messages)")


# option dest -> KernelConfig field, for the options whose value is used as given
_FIELDS = {"model": "model", "gguf_file": "gguf_file", "quantization": "quantization", "revision": "revision", "download_dir": "download_dir", "tokenizer_dir": "tokenizer_dir",
           "chat_template": "chat_template", "served_model_name": "served_model_name", "dtype": "dtype",
           "kv_cache_dtype": "kv_cache_dtype", "device": "device", "threads": "threads",
           "max_model_len": "max_model_len", "block_size": "block_size", "num_kv_blocks": "num_kv_blocks",
           "kv_cache_gb": "kv_cache_memory_gb", "max_num_seqs": "max_num_seqs",
           "max_num_batched_tokens": "max_num_batched_tokens", "max_queued": "max_queued",
           "scheduling_policy": "scheduling_policy", "max_messages": "max_messages", "max_tools": "max_tools",
           "max_stop_strings": "max_stop_strings", "max_stop_length": "max_stop_length",
           "max_sequences_per_call": "max_sequences_per_call", "async_scheduling": "async_scheduling",
           "num_scheduler_steps": "num_scheduler_steps", "burst_budget_ms": "burst_budget_ms",
           "kv_cache_host_gb": "kv_cache_host_gb", "kv_cache_dir": "kv_cache_dir", "kv_cache_disk_gb": "kv_cache_disk_gb",
           "kv_cache_fsync": "kv_cache_fsync"}


def config_from_args(args: argparse.Namespace, **overrides: Any) -> KernelConfig:
    """The KernelConfig the options of `add_kernel_options` describe (unset ones: the defaults),
    with `overrides` (KernelConfig fields) on top."""
    fields: dict[str, Any] = {}
    for dest, field in _FIELDS.items():
        value = getattr(args, dest, None)
        if isinstance(value, list):  # e.g. a repeatable --served-model-name: the first is the name
            value = value[0] if value else None
        if value is not None:
            fields[field] = value
    if getattr(args, "no_prefix_caching", False):
        fields["enable_prefix_caching"] = False
    fields.update(_lora_fields(args))
    if getattr(args, "speculative_config", None):
        try:
            fields["speculative_config"] = json.loads(args.speculative_config)
        except ValueError as e:
            raise CommandError(f"--speculative-config: the value is not JSON ({e})") from None
    for item in getattr(args, "stage", ()):
        stage, _, name = item.partition("=")
        if stage not in STAGES or not name:
            raise CommandError(f"--stage {item!r}: expected STAGE=NAME with STAGE one of {', '.join(STAGES)}")
        fields[stage] = name
    plugin_config: dict[str, dict] = {}
    if getattr(args, "otlp_traces_endpoint", None):  # an explicit --plugin-config otel=... below wins
        plugin_config["otel"] = {"endpoint": args.otlp_traces_endpoint,
                                 "capture_content": bool(getattr(args, "otlp_capture_content", False))}
    for item in getattr(args, "plugin_config", ()):
        name, _, raw = item.partition("=")
        try:
            value = json.loads(raw)
        except ValueError as e:
            raise CommandError(f"--plugin-config {item!r}: the value is not JSON ({e})") from None
        if not name or not isinstance(value, dict):
            raise CommandError(f"--plugin-config {item!r}: expected PLUGIN={{json object}}")
        plugin_config[name] = value
    if plugin_config:
        fields["plugin_config"] = plugin_config
    try:
        return KernelConfig(**(fields | overrides))
    except (ConfigError, TypeError) as e:
        raise CommandError(str(e)) from None


def _lora_fields(args: argparse.Namespace) -> dict[str, Any]:
    """KernelConfig's LoRA fields from --lora-modules NAME=DIR ..., --max-loras, --max-cpu-loras, --max-lora-rank and
    --allow-runtime-lora-updates."""
    fields: dict[str, Any] = {}
    modules: dict[str, str] = {}
    for item in getattr(args, "lora_modules", None) or ():
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise CommandError(f"--lora-modules {item!r}: expected NAME=DIR (a PEFT adapter directory)")
        if name in modules:
            raise CommandError(f"--lora-modules: the name {name!r} is given twice")
        modules[name] = path
    if modules:
        fields["lora_modules"] = modules
    for dest in ("max_loras", "max_cpu_loras", "max_lora_rank"):
        if getattr(args, dest, None) is not None:
            fields[dest] = getattr(args, dest)
    if getattr(args, "allow_runtime_lora_updates", False):
        fields["runtime_lora_updates"] = True
    return fields


def kernel_from_args(args: argparse.Namespace, *, plugins: Any = (), blocked: Any = (), **overrides: Any) -> Kernel:
    """A Kernel (not started) with the configuration and global plugin options of `args`;
    `overrides` are KernelConfig fields that win over the options."""
    return Kernel(config_from_args(args, **overrides),
                  plugins=[*getattr(args, "plugins", ()), *plugins], blocked=[*getattr(args, "blocked", ()), *blocked])


async def wait_ready(kernel: Kernel, timeout_s: float = 10.0) -> None:
    """Return once a started kernel's engine loop runs (it starts as a task of its own)."""
    import anyio

    with anyio.fail_after(timeout_s):
        while not kernel.ready:
            await anyio.sleep(0.001)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {value}")
    return value
