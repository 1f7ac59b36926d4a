"""The Kernel: assembles the stages from plugins, admits requests and runs the engine loop.

    async with Kernel() as kernel:                     # the built-in demo model
        async for event in kernel.generate("Hello", max_tokens=16):
            ...
        handles = await kernel.submit_choices(GenerateRequest(prompt="Hi", n=4, params=SamplingParams(seed=7)))
"""
from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterable
from typing import Any

import anyio
import msgspec

from modelcall.core.burst import BurstPolicy
from modelcall.core.config import KernelConfig
from modelcall.core.engine import Engine
from modelcall.core.entry import Entered, Entry, EntryInput
from modelcall.core.errors import ConfigError, ModelNotFound
from modelcall.core.prompt import answered_calls
from modelcall.core.record import RequestRecord
from modelcall.core.handle import RequestHandle
from modelcall.core.host import PluginHost, PluginLike
from modelcall.core.metering import Caller, Exchange
from modelcall.core.output import OutputStage
from modelcall.core.plan import ModelSpec
from modelcall.core.request import Request
from modelcall.core import heap_freeze, speculative
from modelcall.core.stages import KVCachePolicy, ModelRunner, Sampler, Scheduler, Tokenizer
from modelcall.core.submit import Choice, GenerateRequest, Submitting
from modelcall.core.tooling import ToolSupport
from modelcall.events import (
    TERMINAL_EVENTS, EventBus, RequestAdmitted, RequestQueued, RequestRejected, now,
)

log = logging.getLogger("modelcall.kernel")


class Kernel(Submitting):
    """One model, its stages, and the engine loop that serves it (its submit surface: core/submit.py)."""

    def __init__(self, config: KernelConfig | None = None, *, plugins: Iterable[PluginLike] = (),
                 blocked: Iterable[str] = (), load_entrypoints: bool = True, **config_fields: Any) -> None:
        if config is not None and config_fields:
            config = msgspec.structs.replace(config, **config_fields)
        self.config = config or KernelConfig(**config_fields)
        self._plugin_args = (tuple(plugins), tuple(blocked), load_entrypoints)
        self.host: PluginHost | None = None
        self.bus = EventBus()
        self.tokenizer: Tokenizer
        self.runner: ModelRunner
        self.sampler: Sampler
        self.kv: KVCachePolicy
        self.scheduler: Scheduler
        self.spec: ModelSpec
        self.model_dir: str = ""
        self.safety_filters: list[tuple[str, Any]] = []
        self.meters: list[tuple[str, Any]] = []
        self.tools: ToolSupport | None = None  # tool-call parsers and the constraint backend
        self.output_stage: OutputStage | None = None  # builds each request's output pipeline
        self.pooler: Any = None  # the model's pooling stage (core/pooling.py); None: no pooling requests
        self._reservers: list[Any] = []               # meters with reserve(admission)
        self._output_filters: list[tuple[str, Any]] = []  # safety filters with output_filter(request)
        self.engine: Engine | None = None
        self.entry = Entry(self)  # the entry pipeline every request passes (core/entry.py)
        self.model_aliases: tuple[str, ...] = ()  # other names a front end serves the model under
        self._tg: anyio.abc.TaskGroup | None = None
        self._draining = False
        self.started_at: float | None = None
        # Room for plugins' per-kernel state, keyed by plugin name; never read by the kernel. The
        # registration and lifecycle hooks get the kernel, so a plugin finds its own state here
        # (not in module globals: two kernels in one process, even on one config, stay apart).
        self.plugin_state: dict[str, Any] = {}

    @classmethod
    def from_config(cls, config: KernelConfig | dict | None = None, **kwargs: Any) -> Kernel:
        if isinstance(config, dict):
            config = msgspec.convert(config, KernelConfig)
        return cls(config, **kwargs)

    @property
    def model_name(self) -> str:
        return self.config.served_model_name or self.spec.name

    @property
    def task(self) -> str:
        """What the model serves: "generate", "embed" or "score" (its pooler's task), or both ("generate,embed")."""
        generates = getattr(self.runner, "generates", True)
        pools = getattr(self.pooler, "task", "embed") if self.pooler is not None else None
        tasks = (["generate"] if generates else []) + ([pools] if pools else [])
        return ",".join(tasks)

    @property
    def window(self) -> int:
        return self.config.max_model_len or self.spec.max_model_len

    # ---- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Assemble every stage from the plugins and start the engine loop.

        Nothing is left half-started when a plugin fails: the plugins whose `startup` ran get
        their `shutdown`, the model is released, and the error (a PluginError naming the plugin
        and the hook) is raised.
        """
        started: list[str] = []
        try:
            await self._start(started)
        except BaseException:
            await self._abandon_start(started)
            raise

    async def _abandon_start(self, started: list[str]) -> None:
        for name in reversed(started):
            try:
                await self.host.lifecycle("shutdown", only=(name,), kernel=self)  # type: ignore[union-attr]
            except Exception:  # the start-up error is the one to report
                log.exception("plugin %r failed to shut down after a failed start", name)
        runner = getattr(self, "runner", None)
        if runner is not None:
            try:
                runner.close()
            except Exception:
                log.exception("closing the model runner after a failed start failed")
        self.engine = None

    async def _start(self, started: list[str]) -> None:
        plugins, blocked, load_eps = self._plugin_args
        self.host = host = PluginHost(plugins, blocked=blocked, load_entrypoints=load_eps)
        cfg = self.config
        self.model_dir = cfg.model if cfg.model is not None and _is_model_dir(cfg.model) else \
            await anyio.to_thread.run_sync(self._find_model_dir)
        await anyio.to_thread.run_sync(self._assemble)
        for _plugin, args, kw in host.collect("register_observers", config=cfg, kernel=self):
            event_type, observer = args[0], args[1]
            self.bus.subscribe(event_type, observer, kw.get("name") or (args[2] if len(args) > 2 else _plugin))
        self.safety_filters = [(p, a[0]) for p, a, _ in host.collect("register_safety_filters", config=cfg, kernel=self)]
        self.meters = [(p, a[0]) for p, a, _ in host.collect("register_meters", config=cfg, kernel=self)]
        for name, meter in self.meters:  # meters settle on each request's terminal event
            self.bus.subscribe(TERMINAL_EVENTS, meter.observe, f"{name}.meter")
        self._reservers = [m for _, m in self.meters if hasattr(m, "reserve")]
        self._output_filters = [(n, f) for n, f in self.safety_filters if hasattr(f, "output_filter")]
        self.tools = ToolSupport.assemble(host, cfg, self.tokenizer, self.model_dir, self.bus)
        self.output_stage = OutputStage.assemble(host, cfg, self.tokenizer, self._output_filters)
        self.bus.freeze()
        self.engine = Engine(self.scheduler, self.runner, self.kv, self.bus, self.window, cfg.consumer_timeout_s)
        self.engine.speculator = getattr(self, "speculator", None)
        self.engine.pooler = self.pooler
        self.engine.async_scheduling = cfg.async_scheduling
        if cfg.num_scheduler_steps > 1 and self.engine.speculator is None:   # drafts amortize a step another way
            self.engine.bursts = BurstPolicy(cfg.num_scheduler_steps, cfg.burst_budget_ms / 1e3)
        await host.lifecycle("startup", done=started, kernel=self)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self.engine.run)
        while not self.engine.alive:  # NOTE: start() returns once requests are accepted
            await anyio.sleep(0)
        heap_freeze.freeze()   # the loaded model out of every collection's walk (core/heap_freeze.py)
        self.started_at = now()

    def _find_model_dir(self) -> str:
        """Not a model directory: the plugins resolve it (no model: the default model's plugin; a hub id org/name, a
        GGUF file, a built-in name: the runner's and the model plugins'). A plugin may answer with another reference
        (a name resolved to a file), which is resolved again, until a directory with config.json comes back."""
        host, cfg = self.host, self.config
        assert host is not None
        model = cfg.model
        for _ in range(4):
            if model is not None and _is_model_dir(model):
                return model
            asked = cfg if model == cfg.model else msgspec.structs.replace(cfg, model=model)
            if model is None:
                found = host.provide("provide_model_dir", "model", config=asked)
            else:
                found = host.pm.hook.provide_model_dir(config=asked)
            if found is None:
                raise ModelNotFound(f"model {model!r} not found: give a Hugging Face model directory with config.json, "
                                    "a GGUF file, a hub id org/name, a built-in name (smollm2, gemma3-270m, trained, "
                                    "random), or no model for the default one")
            if found == model:
                break
            model = found
        raise ModelNotFound(f"model {cfg.model!r} resolved to {model!r}, which is not a model directory")

    def _assemble(self) -> None:
        host, cfg = self.host, self.config
        assert host is not None
        self.tokenizer = host.provide("provide_tokenizer", "tokenizer", config=cfg, model_dir=self.model_dir)
        self.sampler = host.provide("provide_sampler", "sampler", config=cfg)
        self.runner = host.provide("provide_model_runner", "runner", config=cfg, model_dir=self.model_dir,
                                   sampler=self.sampler)
        self.spec = self.runner.spec
        # None: this model serves no pooling requests (no plugin pools it)
        self.pooler = host.pm.hook.provide_pooler(config=cfg, model_dir=self.model_dir, runner=self.runner)
        num_blocks = cfg.num_kv_blocks or max(
            2, int(cfg.kv_cache_memory_gb * 2**30) // self.runner.kv_block_bytes(cfg.block_size))
        self.runner.allocate_kv_cache(num_blocks, cfg.block_size)
        evict = self._provide_seam("provide_eviction_policy", "eviction_policy", num_blocks=num_blocks)
        self.kv = host.provide("provide_kv_cache", "kv_cache", config=cfg, spec=self.spec, num_blocks=num_blocks,
                               eviction_policy=evict)
        waiting = self._provide_seam("provide_waiting_queue", "waiting_queue")
        self.scheduler = host.provide("provide_scheduler", "scheduler", config=cfg, kv_cache=self.kv,
                                      waiting_queue=waiting)
        self.speculator = speculative.assemble(host, cfg)   # None: speculation off (the default)
        if self.speculator is not None:
            self.scheduler.speculator = self.speculator

    def _provide_seam(self, hook: str, stage: str, **kwargs: Any) -> Any:
        """A part of a stage (`core/policies.py`), handed to that stage's provider: None when no
        plugin answers, unless the configuration names one (then nobody answering is an error)."""
        assert self.host is not None
        try:
            return self.host.provide(hook, stage, config=self.config, **kwargs)
        except ConfigError:  # raised by the host only when nobody answered
            if getattr(self.config, stage) != "auto":
                raise
            return None

    async def stop(self) -> None:
        """Abort what is still running, stop the loop, run shutdown hooks, release the model."""
        if self.engine is not None:
            self.engine.stop()
        if self._tg is not None:
            await self._tg.__aexit__(None, None, None)
            self._tg = None
        if self.host is not None and self.engine is not None:
            await self.host.lifecycle("shutdown", kernel=self)
            self.runner.close()
            heap_freeze.thaw()
        self.engine = None

    async def drain(self, timeout_s: float = 30.0) -> bool:
        """Refuse new requests and wait for the running ones to finish; True when all did."""
        self._draining = True
        with anyio.move_on_after(timeout_s):
            while self.engine is not None and self.engine.num_unfinished:
                await anyio.sleep(0.02)
            return True
        return False

    @property
    def ready(self) -> bool:
        return self.engine is not None and self.engine.alive and not self._draining

    @property
    def draining(self) -> bool:
        return self._draining

    # ---- requests -------------------------------------------------------------------------

    async def submit_choice(self, request: GenerateRequest, exchange: Exchange | None = None,
                            choice: Choice = Choice()) -> RequestHandle:
        """Run the entry pipeline (`core/entry.py`) on one request, one choice of its call, admit it, and
        return its handle; `submit` and `submit_choices` (core/submit.py) come here, and so does a
        replica with the choice its front end sent.

        Tools and structured output (OpenAI meanings): with `tools` and `tool_choice` other than
        "none", the model's tool-call parser (or `tool_parser`) turns call markup into
        `TokensEmitted.tool_calls` deltas and `ToolRequested` events, and the request finishes with
        "tool_calls"; `tool_choice` "required" or a named function, and `response_format` json_object
        or json_schema, add a constraint backend's logits processor.
        """
        received = now()
        r = request
        rid = r.request_id or f"req-{uuid.uuid4().hex[:16]}"
        inp = EntryInput.of(r, rid, choice, exchange)
        e = await self.entry.run(inp)
        handle = self._admit(rid, e, received, r, choice)
        if exchange is not None:
            exchange.handles.append(handle)
        return handle

    async def count_tokens(self, prompt: str | None = None, *, messages: list[dict] | None = None,
                           tools: list[dict] | None = None, prompt_token_ids: list[int] | None = None,
                           chat_template_kwargs: dict | None = None, caller: Caller | None = None,
                           exchange: Exchange | None = None) -> int:
        """The prompt's token count, through the same entry steps as `submit` (caller, caps, filters,
        permissions; one request against the caller's rpm) but nothing is admitted."""
        request = GenerateRequest(prompt=prompt, messages=messages, prompt_token_ids=prompt_token_ids, tools=tools,
                                  chat_template_kwargs=chat_template_kwargs, caller=caller)
        inp = EntryInput.of(request, f"count-{uuid.uuid4().hex[:16]}", Choice(sequences=0), exchange)
        return await self.entry.count(inp)

    def _admit(self, rid: str, e: Entered, received: float, r: GenerateRequest, choice: Choice) -> RequestHandle:
        """The last entry step: the request's state, output pipeline, events, and the engine's inbox."""
        ids, params, max_tokens, task_id, caller, prepared = e.ids, e.params, e.max_tokens, e.task_id, e.caller, e.prepared
        priority, cache_salt, parts, context, retries = e.priority, e.cache_salt, e.parts, e.context, e.retries
        req = Request(rid, ids, params, task_id=task_id, priority=priority, arrival=received,
                      cache_salt=cache_salt, max_tokens=max_tokens, eos_token_ids=self.spec.eos_token_ids
                      | self.tokenizer.eos_token_ids)
        req.fork_of, req.num_forks = choice.fork_of, choice.forks
        req.pooling = e.pooling
        req.lora = e.lora
        output = self.output_stage.open(req, tool_stream=prepared.stream if prepared is not None else None,
                                        chat=r.messages is not None or choice.chat,
                                        chat_template_kwargs=r.chat_template_kwargs)
        record = RequestRecord(req, output, received, now())
        if prepared is not None:
            req.logits_processors.extend(prepared.processors)
        stream = self.bus.open_stream(rid, self.config.stream_capacity)
        assert self.engine is not None
        self.bus.publish((
            RequestAdmitted(request_id=rid, task_id=task_id, ts=record.admitted, model=self.model_name,
                            prompt_tokens=len(ids), max_tokens=max_tokens, priority=priority,
                            caller=caller.name if caller is not None else None, prompt_parts=parts,
                            dropped_messages=context["dropped_messages"] if context else 0, retries=retries,
                            tool_results=answered_calls(r.messages), kind=self._kind(e.pooling),
                            lora=e.lora.name if e.lora is not None else None),
            RequestQueued(request_id=rid, task_id=task_id, ts=record.admitted, num_waiting=self.scheduler.num_waiting + 1),
        ))
        self.engine.add(record)
        handle = RequestHandle(rid, task_id, stream, self.abort, ids)
        handle.context = context
        handle.prompt_parts = parts
        return handle

    def _kind(self, pooling: Any) -> str:
        """What a request asks of the model, as records tell requests apart: generation, or its pooler's task."""
        return "generate" if pooling is None else getattr(self.pooler, "task", "embed")

    def abort(self, request_id: str) -> None:
        """End a request; its stream ends with `Finished(reason="abort")` and its blocks are freed."""
        if self.engine is not None:
            self.engine.abort(request_id)

    def stats(self) -> dict[str, Any]:
        """A snapshot for /ready, /metrics and tests."""
        eng = self.engine
        return {
            "running": self.scheduler.num_running if eng else 0,
            "waiting": self.scheduler.num_waiting if eng else 0,
            "unfinished": eng.num_unfinished if eng else 0,
            "steps": eng.step_count if eng else 0,
            "kv": self.kv.stats() if eng else {},
            "observer_errors": dict(self.bus.observer_errors),
        }


def _is_model_dir(path: str) -> bool:
    """A Hugging Face model directory, used as it is (anything else is resolved by the plugins)."""
    return os.path.isfile(os.path.join(path, "config.json"))
