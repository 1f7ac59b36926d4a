"""Must-show: server-hosted tools run inside one Responses request (the provider-side loop) on the
random-weight model with a forced choice — an MCP server written here with the `mcp` package, over
stdio and over streamable HTTP, and a Python tool from a plugin; a key without the tool is refused;
a failing and a hanging tool come back to the model as explicit errors; a tool that changes the world
runs exactly once across a retried request; the ledger row and `modelcall report` of the request
show the tool's own duration.

Run as a script this file is the MCP server: `python test_server_tools_mcp.py stdio|http PORT`.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

from pydantic import Field

MODEL = "demo-model-1"
HERE = Path(__file__).resolve()


# ---- the MCP server (runs in a child process) -------------------------------------------------------

def serve(transport: str, port: int = 0) -> None:
    from mcp.server.mcpserver import MCPServer

    app = MCPServer("modelcall-test")

    @app.tool()
    def lookup(key: Annotated[str, Field(max_length=6)]) -> str:
        """Look a key up."""
        return f"value-of-{key}"

    @app.tool()
    def boom() -> str:
        """Always fails."""
        from mcp.server.mcpserver.exceptions import ToolError

        raise ToolError("the disk is on fire")

    @app.tool()
    async def hang() -> str:
        """Never answers."""
        import anyio

        await anyio.sleep(3600)
        return "never"

    @app.tool()
    def record(note: Annotated[str, Field(max_length=6)]) -> str:
        """Append a note to the journal (changes the world)."""
        with open(os.environ["JOURNAL"], "a") as f:
            f.write(note + "\n")
        return f"recorded {note!r}"

    if transport == "stdio":
        app.run("stdio")
    else:
        app.run("streamable-http", host="127.0.0.1", port=port)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    raise SystemExit(0)


# ---- the tests ----------------------------------------------------------------------------------

import openai  # noqa: E402
import pytest  # noqa: E402
from http_server import ServerThread  # noqa: E402
from keys_util import write_keys  # noqa: E402

from modelcall.core import hookimpl  # noqa: E402
from modelcall.core.tools import tool  # noqa: E402
from modelcall.events import RequestAdmitted, ToolExecuted, ToolFailed  # noqa: E402
from modelcall.plugins.http.settings import ServerSettings  # noqa: E402
from modelcall.testing.collector import EventCollector  # noqa: E402

KEY, LIMITED = "mc-test-ops", "mc-test-limited"


class PythonTools:
    """A plugin hosting one typed Python tool (the same `Tool` the agent runtime uses)."""

    modelcall_plugin_name = "test.python_tools"

    @hookimpl
    def register_server_tools(self, register):
        def clock(zone: Annotated[str, "tz"] = "UTC") -> str:
            """The time in a zone."""
            return f"12:00 {zone}"

        def dump() -> str:
            """A very long report."""
            return "word " * 3000

        register(tool(clock, timeout_s=5), server_label="py")
        register(dump, server_label="py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def journal(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("mcp") / "journal.txt"


@pytest.fixture(scope="module")
def http_mcp(journal):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(HERE), "http", str(port)], env={**os.environ, "JOURNAL": str(journal)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "the MCP HTTP server did not start"
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def collector():
    return EventCollector()


@pytest.fixture(scope="module")
def ledger(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ledger") / "ledger.sqlite3"


@pytest.fixture(scope="module")
def server(collector, http_mcp, journal, ledger, tmp_path_factory):
    keys = write_keys(tmp_path_factory.mktemp("keys") / "keys.toml",
                      {KEY: {"name": "ops"}, LIMITED: {"name": "limited", "tools": ["files__lookup"]}})
    tools = {"servers": [
        {"label": "files", "command": [sys.executable, str(HERE), "stdio"], "env": {"JOURNAL": str(journal)},
         "changes_world": ["record"], "tool_timeouts": {"hang": 0.5}},
        {"label": "web", "url": http_mcp, "tool_timeouts": {"hang": 0.5}},
    ]}
    config = {"server_tools": tools, "auth": {"api_keys": str(keys)}, "ledger": {"path": str(ledger)}}
    with ServerThread(ServerSettings(port=0), plugins=(collector, PythonTools()), max_model_len=2048,
                      num_kv_blocks=1024, plugin_config=config) as s:
        yield s


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def _mcp(label: str, name: str) -> dict:
    return dict(tools=[{"type": "mcp", "server_label": label, "allowed_tools": [name], "require_approval": "never"}],
                tool_choice={"type": "mcp", "server_label": label, "name": name})


def _calls(response) -> list:
    return [o for o in response.output if o.type == "mcp_call"]


@pytest.mark.parametrize("label", ["files", "web"], ids=["stdio", "streamable_http"])
def test_an_mcp_tool_runs_inside_one_request(oai, collector, label):
    r = oai.responses.create(model=MODEL, input="Look up the key abc.", max_output_tokens=120, temperature=1.0,
                             parallel_tool_calls=False, max_tool_calls=1, extra_body={"seed": 5}, **_mcp(label, "lookup"))
    [call] = _calls(r)[:1]
    args = json.loads(call.arguments)
    assert call.server_label == label and call.name == "lookup" and call.status == "completed"
    assert call.output == f"value-of-{args['key']}" and call.error is None
    passes = [e for e in collector.of(RequestAdmitted) if e.task_id == r.id]
    assert len(passes) == 2  # generate -> tool -> generate again, inside one request
    assert r.usage.input_tokens == sum(p.prompt_tokens for p in passes)  # usage sums the passes
    executed = [e for e in collector.of(ToolExecuted) if e.call_id == call.id[4:]]
    assert len(executed) == 1 and executed[0].name == f"{label}__lookup" and executed[0].duration_s > 0
    assert executed[0].request_id == passes[0].request_id


def test_streamed_hosted_call_events_and_ids(oai):
    events = list(oai.responses.create(model=MODEL, input="Look up the key abc.", max_output_tokens=120, stream=True,
                                       parallel_tool_calls=False, max_tool_calls=1, temperature=1.0,
                                       extra_body={"seed": 5}, **_mcp("files", "lookup")))
    final = events[-1].response
    [call] = _calls(final)[:1]
    mine = [e.type for e in events if getattr(e, "item_id", None) == call.id
            or (e.type.startswith("response.output_item") and e.item.id == call.id)]
    assert mine[0] == "response.output_item.added" and mine[-1] == "response.output_item.done"
    assert mine[-3:] == ["response.mcp_call.in_progress", "response.mcp_call.completed", "response.output_item.done"]
    assert "response.mcp_call_arguments.delta" in mine and "response.mcp_call_arguments.done" in mine
    done = next(e for e in events if e.type == "response.output_item.done" and e.item.id == call.id)
    assert done.item.output == call.output and done.item.arguments == call.arguments
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type in ("response.completed", "response.incomplete")
    # first the server's tool list, as OpenAI sends it; a continuation does not list again
    listing = final.output[0]
    assert listing.type == "mcp_list_tools" and listing.server_label == "files"
    assert [t.name for t in listing.tools] == ["lookup"] and listing.tools[0].input_schema["properties"]["key"]
    assert [e.type for e in events[2:6]] == ["response.output_item.added", "response.mcp_list_tools.in_progress",
                                             "response.mcp_list_tools.completed", "response.output_item.done"]
    more = oai.responses.create(model=MODEL, previous_response_id=final.id, input="Again.", max_output_tokens=60,
                                parallel_tool_calls=False, max_tool_calls=1, **_mcp("files", "lookup"))
    assert [o.type for o in more.output][0] == "mcp_call"


def test_a_python_tool_from_a_plugin_enabled_by_name(oai):
    r = oai.responses.create(model=MODEL, input="What time is it?", max_output_tokens=120, parallel_tool_calls=False,
                             max_tool_calls=1, temperature=1.0, extra_body={"seed": 2},
                             tools=[{"type": "server_tool", "name": "py__clock"}],
                             tool_choice={"type": "function", "name": "py__clock"})
    [call] = _calls(r)[:1]
    assert call.server_label == "py" and call.name == "clock" and call.status == "completed"
    assert call.output.startswith("12:00 ")


def test_a_key_without_the_tool_is_refused(server):
    limited = openai.OpenAI(base_url=server.base_url + "/v1", api_key=LIMITED, max_retries=0, timeout=60)
    with pytest.raises(openai.PermissionDeniedError) as e:
        limited.responses.create(model=MODEL, input="x", max_output_tokens=8, **_mcp("web", "lookup"))
    assert "web__lookup" in e.value.message
    ok = limited.responses.create(model=MODEL, input="x", max_output_tokens=64, parallel_tool_calls=False,
                                  max_tool_calls=1, **_mcp("files", "lookup"))
    assert _calls(ok)[0].status == "completed"


@pytest.mark.parametrize("name,error", [("boom", "the disk is on fire"), ("hang", "did not finish within its timeout of 0.5 s")])
def test_failing_and_hanging_tools_come_back_as_explicit_errors(oai, collector, name, error):
    t0 = time.monotonic()
    r = oai.responses.create(model=MODEL, input="Try it.", max_output_tokens=64, parallel_tool_calls=False,
                             max_tool_calls=1, **_mcp("web", name))
    assert time.monotonic() - t0 < 30
    [call] = _calls(r)[:1]
    assert call.status == "failed" and error in call.error and call.output is None
    failed = [e for e in collector.of(ToolFailed) if e.call_id == call.id[4:]]
    assert len(failed) == 1 and error in failed[0].error
    if name == "hang":
        assert 0.45 <= failed[0].duration_s < 5
    passes = [e for e in collector.of(RequestAdmitted) if e.task_id == r.id]
    assert len(passes) == 2  # the error went back into the context and the model generated again


def test_a_world_changing_tool_runs_once_across_a_retried_request(oai, server, journal):
    kw = dict(model=MODEL, input="Record the note hi.", max_output_tokens=200, parallel_tool_calls=False,
              max_tool_calls=1, temperature=1.0, extra_body={"seed": 11}, extra_headers={"Idempotency-Key": "job-42"},
              **_mcp("files", "record"))
    first = None
    with oai.responses.create(**kw, stream=True) as stream:
        for ev in stream:
            if ev.type == "response.output_item.done" and ev.item.type == "mcp_call":
                first = ev.item
                break  # the client goes away after the tool ran: the request is lost, then retried
    assert first is not None and first.status == "completed"
    deadline = time.monotonic() + 30
    while server.stats()["unfinished"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    retried = oai.responses.create(**kw)
    [again] = _calls(retried)[:1]
    assert retried.id.startswith("resp_") and again.arguments == first.arguments
    assert again.status == "completed" and again.output == first.output
    assert journal.read_text().splitlines() == [json.loads(first.arguments)["note"]]  # ran once


def test_ledger_row_and_report_show_the_tool_duration(oai, server, ledger):
    from modelcall.plugins.ledger.plugin import ledger_of
    from modelcall.plugins.ledger.report import render, task_report
    from modelcall.plugins.ledger.store import open_readonly

    r = oai.responses.create(model=MODEL, input="Try it.", max_output_tokens=64, parallel_tool_calls=False,
                             max_tool_calls=1, **_mcp("web", "hang"))
    ledger_of(server.kernel)[0].flush(10)
    conn = open_readonly(ledger)
    rows = conn.execute("SELECT name, outcome, duration_s FROM tool_calls WHERE task_id = ?", (r.id,)).fetchall()
    assert len(rows) == 1 and rows[0][0] == "web__hang" and rows[0][1] == "failed" and rows[0][2] >= 0.45
    rep = task_report(conn, r.id)
    assert rep["requests"] == 2
    first = rep["time"]["requests"][0]
    assert first["after"]["tools"] == pytest.approx(rows[0][2]) and first["after"]["total"] >= rows[0][2]
    assert rep["completed"]["requests"][0]["tool_calls"][0]["duration_s"] == pytest.approx(rows[0][2])
    assert "then tools" in render(rep)


def test_tools_config_file_is_read_and_checked(tmp_path):
    from modelcall.core.errors import ConfigError
    from modelcall.plugins.server_tools.config import load

    f = tmp_path / "tools.toml"
    f.write_text('[[servers]]\nlabel = "files"\ncommand = ["python", "s.py"]\nchanges_world = ["write"]\n'
                 '[[servers]]\nlabel = "web"\nurl = "http://127.0.0.1:9/mcp"\ntimeout_s = 5\n')
    cfg = load({"server_tools": {"config": str(f)}})
    assert [s.label for s in cfg.servers] == ["files", "web"] and cfg.servers[1].timeout_s == 5
    for servers, says in [([{"label": "a_b", "url": "u"}], "label"), ([{"label": "a"}], "exactly one of"),
                          ([{"label": "a", "url": "u"}, {"label": "a", "url": "u"}], "twice"),
                          ([{"label": "a", "url": "u", "colour": 1}], "colour")]:
        with pytest.raises(ConfigError, match=says):
            load({"server_tools": {"servers": servers}})
    with pytest.raises(ConfigError, match="does not exist"):
        load({"server_tools": {"config": str(tmp_path / "missing.toml")}})


def test_an_unreachable_mcp_server_stops_the_start_naming_it():
    from modelcall.testing import kernel_for_test

    import anyio

    async def start():
        cfg = {"server_tools": {"servers": [{"label": "gone", "url": f"http://127.0.0.1:{_free_port()}/mcp",
                                             "connect_timeout_s": 2}]}}
        async with kernel_for_test(plugin_config=cfg):
            pass

    with pytest.raises(Exception, match="gone") as e:
        anyio.run(start)
    assert "MCP server 'gone'" in str(e.value) or "MCP server 'gone'" in str(e.value.__cause__)


def test_toolbox_validates_authorizes_and_runs_world_changing_tools_once():
    """The execution steps on their own (the live tests cannot produce bad arguments: the grammar forces them)."""
    import anyio

    from modelcall.core.metering import Caller
    from modelcall.plugins.server_tools.claims import Claims
    from modelcall.plugins.server_tools.toolbox import Toolbox

    ran: list[int] = []

    def charge(amount: Annotated[int, "cents"]) -> str:
        """Charge a card."""
        ran.append(amount)
        return f"charged {amount}"

    published: list = []
    box = Toolbox(published.extend, Claims())
    box.add_python(tool(charge, changes_world=True), "pay")
    [info] = box.tools()

    async def go():
        kw = dict(request_id="req-1", task_id="t", idempotency_key="resp_x/0/0")
        bad = await box.execute(info, call_id="c1", arguments='{"amount": "ten"}', **kw)
        assert not bad.ok and "invalid arguments for pay__charge" in bad.error and ran == []
        refused = await box.execute(info, call_id="c1", arguments='{"amount": 5}', caller=Caller(name="k", tools=frozenset()),
                                    **kw)
        assert not refused.ok and "may not use pay__charge" in refused.error and ran == []
        first = await box.execute(info, call_id="c1", arguments='{"amount": 5}', **kw)
        again = await box.execute(info, call_id="c9", arguments='{"amount": 5}', **kw)
        assert first.ok and again.ok and again.replayed and again.output == first.output == "charged 5"
        assert ran == [5]
        other = await box.execute(info, call_id="c2", arguments='{"amount": 7}', **{**kw, "idempotency_key": "resp_x/1/0"})
        assert other.ok and ran == [5, 7]

    anyio.run(go)
    assert [type(e).__name__ for e in published] == ["ToolFailed", "ToolFailed", "ToolExecuted", "ToolExecuted",
                                                   "ToolExecuted"]


def test_a_pass_refused_after_a_tool_ran_fails_the_response_in_its_shape(oai):
    """The tool's output overflows the window: the next pass is refused by the entry (context budget);
    the response ends `failed` with the reason, streamed as response.failed, and the tool's item is kept."""
    kw = dict(model=MODEL, input="Dump it.", max_output_tokens=32, parallel_tool_calls=False, max_tool_calls=1,
              tools=[{"type": "server_tool", "name": "py__dump"}], tool_choice={"type": "function", "name": "py__dump"})
    whole = oai.responses.create(**kw)
    assert whole.status == "failed" and whole.error.code == "context_length_exceeded"
    assert _calls(whole)[0].status == "completed"
    assert oai.responses.retrieve(whole.id).status == "failed"
    events = list(oai.responses.create(**kw, stream=True))
    assert events[-1].type == "response.failed" and events[-1].response.error.code == "context_length_exceeded"
    assert "response.mcp_call.completed" in [e.type for e in events]
