"""One kernel replica as a Ray Serve deployment: the whole kernel (entry, engine, output) runs here;
the front end sends it a Call and reads back msgpack bytes (wire.py).

Leaving the stream early (the client went, the front end cancels the Ray call) aborts the request
here, so its KV blocks are freed on the replica that holds them.
"""
from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from modelcall.core import InvalidRequest, Kernel, KernelConfig, ModelcallError
from modelcall.core.metering import Exchange
from modelcall.events.codec import to_msgpack
from modelcall.plugins.scale import wire

log = logging.getLogger("modelcall.scale")

# Recorders run once, in the front end, on the events every replica streams back: one ledger, one
# /metrics, one request log. A replica running them too would count each request twice.
FRONT_END_ONLY = ("ledger", "exchange", "metrics", "request_log", "console", "otel")


class KernelReplica:
    """A Ray Serve deployment class (wrapped by `serve.deployment` in deploy.py)."""

    async def __init__(self, config: dict[str, Any], plugins: list[str], blocked: list[str]) -> None:
        from ray import serve

        ctx = serve.get_replica_context()
        self.name = ctx.replica_id.unique_id
        self.actor_name = _actor_name()
        cfg = msgspec.convert(config, KernelConfig)
        self.kernel = Kernel(cfg, plugins=plugins, blocked=[*blocked, *FRONT_END_ONLY])
        # NOTE: the kernel's task group must be left in the task that entered it, and Ray Serve runs
        # __init__ and __del__ in different tasks: the kernel lives in a task of its own.
        self._started: asyncio.Future = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._life = asyncio.get_running_loop().create_task(self._live())
        await self._started
        log.info("replica %s (%s) serving %r", self.name, self.actor_name, self.kernel.model_name)

    async def generate(self, call: bytes, route: Any = None) -> AsyncIterator[bytes]:
        """Admit the call; yield Admitted (or Refused) and then every event of the request.
        `route` is read by the request router only."""
        c, exchange = _decoded(call)
        try:
            handle = await self.kernel.submit_choice(c.request, exchange, c.choice)
        except ModelcallError as e:
            yield wire.encode(wire.refusal(e))
            return
        try:
            yield wire.encode(wire.Admitted(replica=self.name, prompt_token_ids=list(handle.prompt_token_ids),
                                            context=handle.context, prompt_parts=handle.prompt_parts))
            async for ev in handle:
                yield to_msgpack(ev)
        finally:
            handle.close()  # NOTE: cancelled mid-stream -> the kernel aborts it and frees its blocks

    async def count_tokens(self, call: bytes, route: Any = None) -> bytes:
        c, exchange = _decoded(call)
        try:
            r = c.request
            n = await self.kernel.count_tokens(r.prompt, messages=r.messages, tools=r.tools,
                                               prompt_token_ids=r.prompt_token_ids,
                                               chat_template_kwargs=r.chat_template_kwargs, caller=r.caller,
                                               exchange=exchange)
        except ModelcallError as e:
            return wire.encode(wire.refusal(e))
        return wire.encode(wire.Counted(replica=self.name, tokens=n))

    def stats(self, route: Any = None) -> dict[str, Any]:
        """The kernel's snapshot, named: /metrics labels each replica's series with `replica`. With its
        meters' gauges (the quota store's up / fail-open / errors: the store is charged here, not in
        the front end)."""
        return {**self.kernel.stats(), "replica": self.name, "actor_name": self.actor_name,
                "ready": self.kernel.ready, "pid": os.getpid(), "meter_gauges": meter_gauges(self.kernel)}

    def describe(self, route: Any = None) -> dict[str, Any]:
        """What the front end needs to stand in for this kernel: the model's spec, names, window."""
        k = self.kernel
        loras = k.loras
        adapters = [msgspec.to_builtins(loras.info(n)) for n in loras.names()] if loras is not None else []
        return {"replica": self.name, "spec": describe_spec(k), "model_name": k.model_name, "window": k.window,
                "model_dir": k.model_dir, "block_size": k.config.block_size, "loras": adapters}

    async def load_lora(self, name: str, path: str, route: Any = None) -> bytes:
        """Load a LoRA adapter here (the front end's runtime load, sent to every replica): Adapter or Refused."""
        try:
            if self.kernel.loras is None:
                raise InvalidRequest("LoRA is off on this replica", field="lora_name")
            info = await asyncio.to_thread(self.kernel.loras.load, name, path)
        except ModelcallError as e:
            return wire.encode(wire.refusal(e))
        return wire.encode(wire.Adapter(name=info.name, path=info.path, rank=info.rank, targets=list(info.targets)))

    async def unload_lora(self, name: str, route: Any = None) -> bytes:
        """Stop serving a LoRA adapter here (requests running on it finish on it): Adapter or Refused."""
        try:
            if self.kernel.loras is None:
                raise InvalidRequest("LoRA is off on this replica", field="lora_name")
            info = self.kernel.loras.info(name)
            await asyncio.to_thread(self.kernel.loras.unload, name)
        except ModelcallError as e:
            return wire.encode(wire.refusal(e))
        return wire.encode(wire.Adapter(name=name, path=info.path if info is not None else ""))

    def record_routing_stats(self) -> dict[str, Any]:
        """What the request router reads besides Ray's own queue length: the kernel's own load."""
        s = self.kernel.stats()
        return {"unfinished": s["unfinished"], "waiting": s["waiting"]}

    def check_health(self) -> None:
        """Ray Serve restarts a replica whose engine loop died."""
        eng = self.kernel.engine
        if not self.kernel.draining and (eng is None or not eng.alive):
            raise RuntimeError(f"replica {self.name}: the engine loop is not running")

    async def drain(self, timeout_s: float, route: Any = None) -> bool:
        """Refuse new requests here and wait for the running ones (SIGTERM on the front end)."""
        return await self.kernel.drain(timeout_s)

    async def _live(self) -> None:
        try:
            async with self.kernel:
                self._started.set_result(None)
                await self._stop.wait()
        except BaseException as e:
            if not self._started.done():
                self._started.set_exception(e)
            raise

    async def __del__(self) -> None:
        """Ray Serve's graceful shutdown (after its own wait for ongoing calls): finish, then stop."""
        await self.kernel.drain(5.0)
        self._stop.set()
        await self._life


def _decoded(call: bytes) -> tuple[wire.Call, Exchange]:
    """The call, and the Exchange the front end knew it in (its caller, task, policy, retries, client)."""
    c = wire.decode_call(call)
    return c, Exchange(c.caller, c.task_id, c.context_policy, c.retries, c.client)


def _actor_name() -> str:
    import ray

    try:
        return ray.get_runtime_context().get_actor_name() or ""
    except Exception:  # noqa: BLE001 - only a label
        return ""


def meter_gauges(kernel: Kernel) -> list[tuple[str, str, float]]:
    """(name, help, value) of every meter that has gauges (optional Meter.gauges, core/metering.py)."""
    out: list[tuple[str, str, float]] = []
    for _name, meter in kernel.meters:
        gauges = getattr(meter, "gauges", None)
        if gauges is not None:
            out.extend((name, doc, float(value)) for name, doc, value in gauges())
    return out


def describe_spec(kernel: Kernel) -> dict[str, Any]:
    """The model spec as plain data (the front end rebuilds a ModelSpec from it)."""
    import dataclasses

    d = dataclasses.asdict(kernel.spec)
    d["eos_token_ids"] = sorted(d["eos_token_ids"])
    d["layer_windows"] = list(d["layer_windows"])
    return d
