"""RemoteKernel: what the HTTP front end holds instead of a Kernel when it serves N replicas.

It has the surface ServingContext and the routes use (submit / count_tokens / abort, tokenizer,
model name and window, bus, host, stats, drain), so no route changes. Each submit goes to one
replica through a Ray Serve handle (the prefix-aware router picks it); the replica's events come
back as msgpack bytes and are published on this front end's bus, so one ledger, one /metrics and
one request log see every replica's requests, and the handle reads them as on one kernel.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
import uuid
from typing import Any

import anyio
import msgspec

from modelcall.core import KernelConfig, RequestHandle
from modelcall.core.errors import InvalidRequest, Unavailable
from modelcall.core.host import PluginHost
from modelcall.core.metering import Exchange
from modelcall.core.plan import ModelSpec
from modelcall.core.prefix_keys import prefix_block_keys, root_key
from modelcall.core.submit import Choice, GenerateRequest, Submitting
from modelcall.events import EventBus, Finished, RequestFailed, TokensEmitted, Usage, now
from modelcall.events.codec import from_msgpack
from modelcall.events.types import TERMINAL_EVENTS, Timings
from modelcall.plugins.scale import deploy, wire
from modelcall.plugins.scale.ranking import RouteKey
from modelcall.plugins.scale.remote_loras import ReplicaLoras
from modelcall.plugins.scale.series import ReplicaSeries

log = logging.getLogger("modelcall.scale")
REPLICA_HEADER = "x-modelcall-replica"
ROUTE_BLOCKS = 8  # the prefix a route looks at: enough to tell system prompts and conversations apart


class RemoteKernel(Submitting):
    """N kernel replicas behind one front end (see module docstring); its submit surface is the
    Kernel's (core/submit.py), with `submit_choice` sent to a replica."""

    def __init__(self, config: KernelConfig, *, plugins: tuple = (), blocked: tuple = (), num_replicas: int = 2,
                 ray_address: str | None = None, num_cpus: int | None = None, submit_retries: int = 2,
                 **router: Any) -> None:
        self.config = config
        self._plugins, self._blocked = list(plugins), list(blocked)
        self.num_replicas = num_replicas
        self.ray_address, self.num_cpus, self.router_kwargs = ray_address, num_cpus, router
        self.submit_retries = submit_retries
        self.host: PluginHost | None = None
        self.bus = EventBus()
        self.plugin_state: dict[str, Any] = {}
        self.model_aliases: tuple[str, ...] = ()
        self.series = ReplicaSeries()
        self.started_at: float | None = None
        self.engine = None  # NOTE: no engine here; plugins that look for one see none
        self._handle: Any = None
        self._draining = False
        self._inflight: dict[str, tuple[str, asyncio.Task]] = {}  # request id -> (replica, pump)
        self._block_size = config.block_size
        self._loras: ReplicaLoras | None = None

    # ---- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self.host = host = PluginHost([*self._plugins, "modelcall.plugins.scale.frontend"], blocked=self._blocked)
        cfg = self.config
        model_dir = cfg.model if cfg.model else await anyio.to_thread.run_sync(
            lambda: host.provide("provide_model_dir", "model", config=cfg))
        # NOTE: the replicas load the directory resolved here (the demo model is built once).
        # NOTE: adapter directories as absolute paths: a replica's worker process runs in a directory of Ray's
        loras = {name: os.path.abspath(path) for name, path in cfg.lora_modules.items()}
        replica_cfg = msgspec.to_builtins(msgspec.structs.replace(cfg, model=model_dir, lora_modules=loras))
        with _signals_kept():
            await anyio.to_thread.run_sync(deploy.start_cluster, self.ray_address, self.num_cpus)
        self._handle = await anyio.to_thread.run_sync(
            lambda: deploy.deploy(replica_cfg, self._plugins, self._blocked, self.num_replicas, **self.router_kwargs))
        info = await self._handle.describe.remote()
        spec = dict(info["spec"])
        spec["eos_token_ids"] = frozenset(spec["eos_token_ids"])
        spec["layer_windows"] = tuple(spec["layer_windows"])
        self.spec = ModelSpec(**spec)
        self._model_name, self._window = info["model_name"], info["window"]
        # the replicas' adapters (each loaded --lora-modules itself): one catalog here for the routes
        self._loras = ReplicaLoras(info.get("loras") or [], self._pinned, deploy.replica_ids) \
            if cfg.lora_enabled else None
        self.model_dir = model_dir
        self.tokenizer = await anyio.to_thread.run_sync(
            lambda: host.provide("provide_tokenizer", "tokenizer", config=cfg, model_dir=model_dir))
        for _plugin, args, kw in host.collect("register_observers", config=cfg, kernel=self):
            self.bus.subscribe(args[0], args[1], kw.get("name") or (args[2] if len(args) > 2 else _plugin))
        self.bus.freeze()
        await host.lifecycle("startup", kernel=self)
        self.started_at = now()

    async def stop(self) -> None:
        for _rid, (_r, task) in list(self._inflight.items()):
            task.cancel()
        if self.host is not None:
            await self.host.lifecycle("shutdown", kernel=self)
        await anyio.to_thread.run_sync(deploy.shutdown)

    async def drain(self, timeout_s: float = 30.0) -> bool:
        """Refuse new requests here and on every replica; wait for the running ones to finish."""
        self._draining = True
        t0 = time.monotonic()
        ids = await anyio.to_thread.run_sync(deploy.replica_ids)
        await asyncio.gather(*(self._pinned("drain", r, 0.0) for r in ids), return_exceptions=True)
        while self._inflight and time.monotonic() - t0 < timeout_s:
            await asyncio.sleep(0.02)
        return not self._inflight

    @property
    def ready(self) -> bool:
        return self._handle is not None and not self._draining

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def model_name(self) -> str:
        return self.config.served_model_name or self._model_name

    @property
    def loras(self) -> ReplicaLoras | None:
        """Every replica's LoRA adapters (plugins/scale/remote_loras.py); None: LoRA is off."""
        return self._loras

    @property
    def window(self) -> int:
        return self.config.max_model_len or self._window

    # ---- requests -------------------------------------------------------------------------

    async def submit_choice(self, request: GenerateRequest, exchange: Exchange | None = None,
                            choice: Choice = Choice()) -> RequestHandle:
        """Kernel.submit_choice on the replica the router picks (a fork on the replica of the choice it
        forks); raises the replica entry's refusals as they are. A replica that dies before answering
        is retried on another."""
        if self._draining:
            raise Unavailable("the server is draining (shutting down); retry on another server")
        if request.logits_processors:
            raise InvalidRequest("logits processors are Python objects and cannot be sent to a replica",
                                 "logits_processors")
        rid = request.request_id or f"req-{uuid.uuid4().hex[:16]}"
        call, route = self._call(msgspec.structs.replace(request, request_id=rid), exchange, choice)
        pin = self._inflight.get(choice.fork_of or "", (None,))[0]
        route = RouteKey(keys=route.keys, pin=pin)
        gen, first = await self._first(call, route)
        if isinstance(first, wire.Refused):
            raise wire.rebuild(first)
        assert isinstance(first, wire.Admitted)
        stream = self.bus.open_stream(rid, self.config.stream_capacity)
        handle = RequestHandle(rid, request.task_id or (exchange.task_id if exchange else None), stream,
                               self.abort, first.prompt_token_ids)
        handle.context, handle.prompt_parts = first.context, first.prompt_parts
        handle.response_headers = {REPLICA_HEADER: first.replica}  # type: ignore[attr-defined]
        handle.replica = first.replica  # type: ignore[attr-defined]
        task = asyncio.get_running_loop().create_task(self._pump(rid, first.replica, gen, handle))
        self._inflight[rid] = (first.replica, task)
        if exchange is not None:
            exchange.handles.append(handle)
        return handle

    async def _first(self, call: bytes, route: RouteKey) -> tuple[Any, wire.Reply]:
        from ray.exceptions import RayError

        last: BaseException | None = None
        for _attempt in range(1 + self.submit_retries):
            gen = self._handle.options(stream=True).generate.remote(call, route=route)
            try:
                return gen, wire.decode_reply(await gen.__anext__())
            except RayError as e:  # nothing was streamed yet: safe to send it elsewhere
                log.warning("replica failed before admitting %s (%s); retrying on another", route.pin or "", e)
                last, route = e, RouteKey(keys=route.keys)
        raise Unavailable(f"no replica admitted the request ({type(last).__name__}: {last})")

    async def _pump(self, rid: str, replica: str, gen: Any, handle: RequestHandle) -> None:
        """Publish the replica's events here; end the request cleanly whatever happens to the replica."""
        from ray.exceptions import RayError

        series = self.series
        ended = False
        usage = Usage(prompt_tokens=len(handle.prompt_token_ids))
        tokens = 0
        try:
            async for data in gen:
                ev = from_msgpack(data)
                if type(ev) is TokensEmitted:
                    tokens += len(ev.token_ids)
                series.observe(replica, ev)
                self.bus.publish((ev,))
                if isinstance(ev, TERMINAL_EVENTS):
                    ended = True
        except asyncio.CancelledError:  # aborted here (client gone, cancel, shutdown)
            gen.cancel()
            if not ended:
                self._end(rid, handle, Finished(request_id=rid, task_id=handle.task_id, reason="abort",
                                                usage=Usage(prompt_tokens=usage.prompt_tokens, completion_tokens=tokens),
                                                timings=Timings(received=now())), replica)
            ended = True
        except RayError as e:
            log.warning("replica %s failed with %s in flight: %s", replica, rid, type(e).__name__)
            self._end(rid, handle, RequestFailed(request_id=rid, task_id=handle.task_id, error_type="ReplicaFailed",
                                                 message=f"replica {replica} went away mid-request "
                                                         f"({type(e).__name__}); retry the request"), replica)
            ended = True
        finally:
            if not ended:
                self._end(rid, handle, RequestFailed(request_id=rid, task_id=handle.task_id, error_type="ReplicaFailed",
                                                     message=f"replica {replica} ended the stream early"), replica)
            self._inflight.pop(rid, None)

    def _end(self, rid: str, handle: RequestHandle, ev: Any, replica: str) -> None:
        self.series.observe(replica, ev)
        self.bus.publish((ev,))

    def abort(self, request_id: str) -> None:
        """End a request: the Ray call is cancelled, which aborts it on its replica (blocks freed)."""
        entry = self._inflight.get(request_id)
        if entry is not None:
            entry[1].cancel()

    async def count_tokens(self, prompt: str | None = None, *, exchange: Any = None, caller: Any = None,
                           **fields: Any) -> int:
        request = GenerateRequest.of(prompt=prompt, caller=caller, **fields)
        call, route = self._call(request, exchange, Choice(sequences=0))
        reply = wire.decode_reply(await self._handle.count_tokens.remote(call, route=route))
        if isinstance(reply, wire.Refused):
            raise wire.rebuild(reply)
        return reply.tokens  # type: ignore[union-attr]

    def _call(self, request: GenerateRequest, exchange: Any, choice: Choice) -> tuple[bytes, RouteKey]:
        caller = exchange.caller if exchange is not None else None
        call = wire.Call(request=request, choice=choice, caller=caller,
                         task_id=exchange.task_id if exchange is not None else None,
                         context_policy=exchange.context_policy if exchange is not None else None,
                         retries=exchange.retries if exchange is not None else 0,
                         client=exchange.client if exchange is not None else None)
        return wire.encode(call), RouteKey(keys=tuple(self.route_keys(request, request.caller or caller)))

    def route_keys(self, request: GenerateRequest, caller: Any = None) -> list[bytes]:
        """Keys of the prompt's first blocks, as the KV cache keys them (the router's input)."""
        ids = self._route_ids(request)
        scope = caller.cache_scope if caller is not None else ""
        # NOTE: the adapter scopes the keys as it scopes each replica's cache: one adapter's prefixes go together
        root = root_key(self.spec.identity or self.model_name, request.lora, f"{scope}\0{request.cache_salt or ''}")
        return prefix_block_keys(ids, self._block_size, root, ROUTE_BLOCKS)

    def _route_ids(self, request: GenerateRequest) -> list[int]:
        # NOTE: only the first ROUTE_BLOCKS blocks matter: tokenize a bounded head of the text and
        # drop its last token (a cut word may tokenize differently than in the whole prompt).
        head = ROUTE_BLOCKS * self._block_size * 8
        if request.prompt_token_ids is not None:
            return list(request.prompt_token_ids)
        if request.prompt is not None:
            return self.tokenizer.encode(str(request.prompt)[:head])[:-1]
        messages = request.messages
        if messages:
            try:
                text = self.tokenizer.apply_chat_template(messages, tools=request.tools,
                                                          **(request.chat_template_kwargs or {}))
            except Exception:  # noqa: BLE001 - the replica's entry reports a bad prompt; route by nothing
                return []
            return self.tokenizer.encode(text[:head])[:-1]
        return []

    # ---- state ----------------------------------------------------------------------------

    async def _pinned(self, method: str, replica: str, *args: Any) -> Any:
        return await getattr(self._handle, method).remote(*args, route=RouteKey(pin=replica))

    async def replica_stats(self) -> dict[str, dict]:
        """Each live replica's kernel stats, by replica id (asked of each one, pinned)."""
        ids = await anyio.to_thread.run_sync(deploy.replica_ids)
        got = await asyncio.gather(*(self._pinned("stats", r) for r in ids), return_exceptions=True)
        return {s["replica"]: s for s in got if isinstance(s, dict)}

    def stats(self) -> dict[str, Any]:
        """This front end's view: requests in flight through it, by replica."""
        by: dict[str, int] = {}
        for replica, _t in self._inflight.values():
            by[replica] = by.get(replica, 0) + 1
        return {"running": len(self._inflight), "waiting": 0, "unfinished": len(self._inflight), "steps": 0,
                "kv": {}, "observer_errors": dict(self.bus.observer_errors), "replicas": by}


@contextlib.contextmanager
def _signals_kept() -> Any:
    """Ray's core worker installs abseil's failure handler over SIGTERM/SIGINT in this process, which
    aborts it (exit 134) instead of letting `modelcall serve` drain: put Python's handlers back."""
    main = threading.current_thread() is threading.main_thread()
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)} if main else {}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)
