"""The metering contract in core: callers, exchanges set per task, admissions, and what the kernel does with them."""
from __future__ import annotations

import anyio
import pytest

from modelcall.core import Overloaded
from modelcall.core.admission import admit_chat
from modelcall.core.metering import Admission, Caller, Exchange, tool_names
from modelcall.events import Finished, RequestAdmitted, RequestRejected

pytestmark = pytest.mark.anyio


async def test_an_exchange_is_passed_explicitly_and_fills_what_the_call_left_unset(make_kernel):
    async with make_kernel() as kernel:
        ex = Exchange(caller=Caller(name="a"), task_id="t-a", retries=2, client="127.0.0.1")
        done = await kernel.complete("hello", max_tokens=2, exchange=ex)
        other = await kernel.complete("hello", max_tokens=2)  # no exchange: nothing carried over
    assert [h.task_id for h in ex.handles] == ["t-a"] and ex.sequences == 1
    assert done.finished.task_id == "t-a" and other.finished.task_id is None


def test_callers_say_what_they_may_use():
    c = Caller(name="x", models=frozenset({"m"}), tools=frozenset({"search"}))
    assert c.may_use_model("m") and not c.may_use_model("other")
    assert c.forbidden_tools(["search", "shell"]) == ["shell"]
    assert Caller(name="y").may_use_model("anything") and Caller(name="y").forbidden_tools(["z"]) == []
    assert tool_names([{"type": "function", "function": {"name": "a"}}, {"name": "b", "input_schema": {}}]) == ("a", "b")


class CountingMeter:
    """Refuses the third admission; remembers what it saw."""

    def __init__(self) -> None:
        self.reserved: list[Admission] = []
        self.settled: list[str] = []

    def reserve(self, adm: Admission) -> None:
        if len(self.reserved) == 2:
            raise Overloaded("three is too many", retry_after=7)
        self.reserved.append(adm)

    def observe(self, ev) -> None:
        self.settled.append(type(ev).__name__)


class MeterPlugin:
    modelcall_plugin_name = "test-meter"

    def __init__(self) -> None:
        self.meter = CountingMeter()

    from modelcall.core import hookimpl

    @hookimpl
    def register_meters(self, register) -> None:
        register(self.meter)


async def test_the_kernel_reserves_at_admission_and_settles_on_the_terminal_event(make_kernel, events):
    plugin = MeterPlugin()
    async with make_kernel(plugins=[plugin]) as kernel:
        ex = Exchange(caller=Caller(name="team", priority=3), task_id="t1", retries=1)
        done = await kernel.complete("hello", max_tokens=3, exchange=ex)
        await kernel.complete("hello again", max_tokens=3, exchange=ex)
        with pytest.raises(Overloaded):
            await kernel.complete("one more", max_tokens=3, exchange=ex)
    adm = plugin.meter.reserved[0]
    assert (adm.caller.name, adm.task_id, adm.max_tokens) == ("team", "t1", 3)
    assert adm.prompt_tokens == done.usage.prompt_tokens
    assert plugin.meter.settled == ["Finished", "Finished", "RequestRejected"]
    admitted = events.of(RequestAdmitted)
    assert [(a.caller, a.task_id, a.priority, a.retries) for a in admitted] == [("team", "t1", 3, 1)] * 2
    [rej] = events.of(RequestRejected)
    assert (rej.status, rej.caller) == (429, "team")
    assert all(f.task_id == "t1" for f in events.of(Finished))


def test_a_template_that_cannot_render_without_tools_still_admits():
    class Tok:
        def encode(self, text):
            return text.split()

        def apply_chat_template(self, messages, tools=None, add_generation_prompt=True):
            if tools is None:
                raise ValueError("this template needs tools")
            return " ".join(m["content"] for m in messages) + " TOOLS"

    msgs = [{"role": "user", "content": "a b c"}]
    ids = Tok().encode(Tok().apply_chat_template(msgs, tools=[{}]))
    chat = admit_chat(Tok(), msgs, [{"name": "t"}], None, ids, lambda n: 10, None)
    assert sum(chat.parts.values()) == len(ids) and chat.parts["tools"] == 0 and chat.parts["user"] == 3
