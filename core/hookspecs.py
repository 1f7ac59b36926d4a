"""The hooks a modelcall plugin can implement.

Three kinds, all called at start-up, never per token:

* provider hooks (`provide_*`, firstresult): return the object for one stage, or None to
  decline. Built-ins are registered `trylast`, so an installed plugin wins; a plugin that only
  wants to serve when configured checks `config.wants(stage, "its-name")`.
* registration hooks (`register_*`): each plugin calls `register(...)` for every thing it adds.
* lifecycle hooks (`startup`, `shutdown`): may be `async def`; the kernel awaits them.

An implementation may take any subset of a hook's arguments, so hooks can gain arguments
without breaking plugins.
"""
from __future__ import annotations

from typing import Any

import pluggy

PROJECT = "modelcall"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# ---- provider hooks -------------------------------------------------------------------------

@hookspec(firstresult=True)
def provide_model_dir(config: Any) -> str | None:
    """Return the model directory to load when `config.model` is None (the built-in demo model
    builds one into the user's cache) or names no local directory (the runner resolves hub ids,
    org/name, to a snapshot in the Hugging Face cache). Return None to decline."""


@hookspec(firstresult=True)
def provide_tokenizer(config: Any, model_dir: str) -> Any:
    """Return a `modelcall.core.stages.Tokenizer` for the model in `model_dir`, or None."""


@hookspec(firstresult=True)
def provide_sampler(config: Any) -> Any:
    """Return a `modelcall.core.stages.Sampler`, or None."""


@hookspec(firstresult=True)
def provide_model_runner(config: Any, model_dir: str, sampler: Any) -> Any:
    """Return a `modelcall.core.stages.ModelRunner` that loads `model_dir` and samples with
    `sampler`, or None. Loading may take seconds; it happens once at start-up."""


@hookspec(firstresult=True)
def provide_pooler(config: Any, model_dir: str, runner: Any) -> Any:
    """Return a `modelcall.core.pooling.Pooler` for the loaded model (its checkpoint's pooling choice), or
    None: the model serves no pooling requests (embeddings). Called once, after the runner is loaded; the
    runner must return hidden states for pooling chunks (`StepOutput.pooled`)."""


@hookspec(firstresult=True)
def provide_eviction_policy(config: Any, num_blocks: int) -> Any:
    """Return a `modelcall.core.policies.EvictionPolicy` holding the free block ids
    `0 .. num_blocks-1` (the order in which free blocks, and the prefixes they cache, are reused),
    or None. The built-in is least recently freed first (`eviction_policy = "lru"`).

    Only the eviction order: the built-in KV policy (`provide_kv_cache`) keeps block tables, prefix
    keys and reference counts and takes whichever policy answered. Optional: when no plugin answers
    and the configuration names none, the KV policy uses its default."""


@hookspec(firstresult=True)
def provide_kv_cache(config: Any, spec: Any, num_blocks: int, eviction_policy: Any) -> Any:
    """Return a `modelcall.core.stages.KVCachePolicy` over `num_blocks` blocks of
    `config.block_size` tokens for the model described by `spec` (a ModelSpec), or None.

    `eviction_policy` is what `provide_eviction_policy` returned (None: nobody answered); a
    policy that keeps a free list reuses blocks in its order. `eviction_policy` was added after
    `num_blocks`: implementations that do not name it keep working."""


@hookspec(firstresult=True)
def provide_waiting_queue(config: Any) -> Any:
    """Return an empty `modelcall.core.policies.WaitingQueue` (the order in which waiting requests
    are admitted), or None. The built-in (`waiting_queue = "default"`) orders by
    `config.scheduling_policy`: arrival (fcfs) or lowest priority value first (priority); for
    `fair` the fair_share plugin answers (priority, then the tenant served the fewest tokens).

    Only the admission order: the built-in scheduler (`provide_scheduler`) keeps batching, chunked
    prefill and preemption and takes whichever queue answered. Optional: when no plugin answers
    and the configuration names none, the scheduler uses its default."""


@hookspec(firstresult=True)
def provide_scheduler(config: Any, kv_cache: Any, waiting_queue: Any) -> Any:
    """Return a `modelcall.core.stages.Scheduler` that allocates through `kv_cache`, or None.

    `waiting_queue` is what `provide_waiting_queue` returned (None: nobody answered); a scheduler
    with a waiting queue admits in its order. `waiting_queue` was added after `kv_cache`:
    implementations that do not name it keep working."""


@hookspec(firstresult=True)
def provide_proposer(config: Any, spec_config: Any) -> Any:
    """Return a `modelcall.core.speculative.Proposer` for `spec_config.method` (a
    `modelcall.core.speculative.SpeculativeConfig`), or None to decline. Called only when
    `config.speculative_config` is set (speculation is off by default)."""


@hookspec(firstresult=True)
def provide_replicated_kernel(config: Any, plugins: Any, blocked: Any, num_replicas: int,
                              ray_address: Any) -> Any:
    """Return a kernel-like object that serves `config` (a KernelConfig) with `num_replicas`
    replicas, or joins the cluster at `ray_address`; `modelcall serve --replicas N` holds it
    instead of a Kernel. It must offer what the HTTP front end uses of a Kernel (`submit`,
    `count_tokens`, `abort`, `tokenizer`, `model_name`, `bus`, `host`, `stats`, `drain`, and
    `async with`). `plugins` and `blocked` are what each replica loads. Return None to decline;
    with no provider, `--replicas` is refused with the extra to install (the built-in one,
    plugins/scale on Ray Serve, needs `modelcall[scale]`)."""


@hookspec(firstresult=True)
def provide_constraint_backend(config: Any, tokenizer: Any, model_dir: str) -> Any:
    """Return a `modelcall.core.constraints.ConstraintBackend` (a grammar engine over `tokenizer`'s
    vocabulary) for `response_format` and forced `tool_choice`, or None. Optional: without one,
    requests that need constrained decoding are refused with a clear error."""


# ---- registration hooks ---------------------------------------------------------------------

@hookspec
def register_observers(register: Any, config: Any, kernel: Any) -> None:
    """Call `register(event_type, observer, name=None)` for each observer.

    `observer(event)` runs inline after each engine step and must take microseconds; wrap slow
    work in `modelcall.events.OffloadedObserver`. `event_type` may be a base class (`Event`
    observes every request event) or a tuple of types.

    `kernel` is the Kernel being started (stages assembled, engine not yet running); keep
    per-kernel state in `kernel.plugin_state[<plugin name>]`, never in module globals. `kernel`
    was added after `config`: implementations that do not name it keep working."""


@hookspec
def register_safety_filters(register: Any, config: Any, kernel: Any) -> None:
    """Call `register(filter)` for each safety filter (`modelcall.core.safety.SafetyFilter`):
    `check_input(text)` refuses a prompt before any compute (400 with the reason);
    `output_filter(request)` gives a per-request streaming filter run inline each step, which
    may redact text or end the request with finish reason `content_filter`.

    `kernel` is the Kernel being started (stages assembled, engine not yet running); keep
    per-kernel state in `kernel.plugin_state[<plugin name>]`, never in module globals. `kernel`
    was added after `config`: implementations that do not name it keep working."""


@hookspec
def register_meters(register: Any, config: Any, kernel: Any) -> None:
    """Call `register(meter)` for each meter (`modelcall.core.metering.Meter`): `observe(event)`
    receives each request's terminal event (Finished, RequestFailed, RequestRejected) and turns
    usage into a figure (a cost, a quota charge, a row in a file). An optional
    `reserve(admission)` is called at admission, before any compute, and may refuse by raising
    `Overloaded` (429) or `PermissionDenied` (403).

    `kernel` is the Kernel being started (stages assembled, engine not yet running); keep
    per-kernel state in `kernel.plugin_state[<plugin name>]`, never in module globals. `kernel`
    was added after `config`: implementations that do not name it keep working."""


@hookspec
def register_tool_parsers(register: Any) -> None:
    """Call `register(name, parser_factory, markers=(...))` for each tool-call output format.

    `parser_factory(new_id)` returns a fresh `modelcall.core.tools.ToolParser` for one response;
    `markers` are strings whose presence in a model's chat template selects this parser when
    the configuration (`plugin_config["tools"]["parser"]`) names none."""


@hookspec
def register_reasoning_parsers(register: Any) -> None:
    """Call `register(name, parser_factory, markers=(...))` for each way a model writes reasoning.

    `parser_factory(tokenizer=, prompt_token_ids=, chat_template_kwargs=)` (any subset) returns a
    fresh `modelcall.core.reasoning.ReasoningParser` for one chat response, or None when reasoning
    is off for it; `markers` are strings that must all appear in a model's chat template for this
    parser to be its default when the configuration (`plugin_config["reasoning"]["parser"]`) names
    none."""


@hookspec
def register_tools(register: Any) -> None:
    """Call `register(function)` for each tool an agent runtime may offer the model."""


@hookspec
def register_server_tools(register: Any, config: Any, kernel: Any) -> None:
    """Call `register(tool, server_label="local")` for each tool the server hosts itself (run inside
    one request by the Responses API's tool loop, see docs/server-tools.md). `tool` is a typed
    function or a `modelcall.core.tools.Tool` (its `changes_world` and `timeout_s` apply);
    the model sees it as `<server_label>__<name>`, a request enables it with
    `{"type": "mcp", "server_label": ...}` or `{"type": "server_tool", "name": ...}`."""


@hookspec
def register_commands(register: Any) -> None:
    """Call `register(name, help, configure, run)` for each CLI subcommand: `configure(parser)`
    adds arguments to an argparse parser, `run(args)` executes and returns an exit code."""


@hookspec
def register_routes(register: Any, config: Any, kernel: Any) -> None:
    """Call `register(method, path, handler)` for each extra HTTP route of `modelcall serve`.

    `kernel` is the started Kernel the server serves (a handler reads its state from it, and
    the plugin its own from `kernel.plugin_state`).
    `kernel` was added after `config`: implementations that do not name it keep working."""


@hookspec
def register_middlewares(register: Any, config: Any, kernel: Any) -> None:
    """Call `register(middleware, order=0)` for each aiohttp middleware of `modelcall serve`
    (lower order runs first, i.e. outermost). They run inside the front end's error handling:
    raise `modelcall.core.ModelcallError` subclasses or aiohttp HTTP errors and the client gets
    the route's protocol error shape.

    `kernel` is the started Kernel the server serves (a middleware publishes on its bus, the plugin
    finds its state in `kernel.plugin_state`). `kernel` was added after `config`: implementations
    that do not name it keep working."""


# ---- lifecycle hooks ------------------------------------------------------------------------

@hookspec
def startup(kernel: Any) -> None:
    """The kernel assembled its stages and is about to start its engine loop. May be async."""


@hookspec
def shutdown(kernel: Any) -> None:
    """The kernel stopped its engine loop. May be async."""
