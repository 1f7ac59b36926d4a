"""LoRA adapters over HTTP: the request's `model` picks the adapter on every generation route, /v1/models lists the
adapters a key may use with the base as `parent`, keys own adapters (403 for another's, a private one never
listed), runtime loading and unloading in vLLM's shapes for admin keys only, structured output and n > 1 on an
adapter. A real server on loopback, the openai and anthropic SDKs, adapters built by PEFT."""
from __future__ import annotations

import json
import time

import anthropic
import httpx
import openai
import pytest

from family_models import build_family
from http_server import ServerThread
from keys_util import write_keys
from lora_adapters import ADAPTERS, build_adapter, build_adapters, reference_outputs

PROMPT = [7, 300, 42, 9, 1500, 11, 77, 78, 1200, 5]
MAX_TOKENS = 8
KEYS = {"k-admin": {"name": "admin", "permissions": ["admin"], "private_loras": ["secret"]},
        "k-alice": {"name": "alice", "loras": ["qv8", "mlp8", "late"]},
        "k-bob": {"name": "bob"}}


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory, demo_model_dir):
    root = tmp_path_factory.mktemp("lora_http")
    base = build_family("llama3", str(root / "base"), demo_model_dir)
    adapters = build_adapters(base, str(root), {k: ADAPTERS[k] for k in ("qv8", "mlp8", "all16")})
    late = build_adapter(base, str(root / "late"), seed=9, **ADAPTERS["kod16"])
    refs = {name: reference_outputs(base, path, [PROMPT], MAX_TOKENS)[0]
            for name, path in (("base", None), ("qv8", adapters["qv8"]), ("late", late))}
    keys = write_keys(root / "keys.toml", KEYS)
    modules = {"qv8": adapters["qv8"], "mlp8": adapters["mlp8"], "secret": adapters["all16"]}
    db = root / "ledger.sqlite3"
    with ServerThread(model=base, dtype="float32", served_model_name="base", lora_modules=modules,
                      runtime_lora_updates=True,
                      plugin_config={"auth": {"api_keys": str(keys)}, "ledger": {"path": str(db)}}) as server:
        server.ledger_path = db
        yield server, refs, late


def _client(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0)


def _text(server, key: str, model: str, n: int = 1) -> list[str]:
    done = _client(server, key).completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                                   n=n, extra_body={"ignore_eos": True})
    return [c.text for c in done.choices]


def _decoded(server, ids: list[int]) -> str:
    return server.kernel.tokenizer.decode(ids, skip_special_tokens=True)


def test_the_model_field_picks_the_adapter(lora_server):
    server, refs, _ = lora_server
    assert _text(server, "k-alice", "qv8") == [_decoded(server, refs["qv8"])]
    assert _text(server, "k-alice", "base") == [_decoded(server, refs["base"])]
    assert refs["qv8"] != refs["base"]


def test_models_lists_the_adapters_a_key_may_use_with_their_parent(lora_server):
    server, _, _ = lora_server
    bob = {m.id: m for m in _client(server, "k-bob").models.list().data}
    assert set(bob) == {"base", "qv8", "mlp8"}          # "secret" is private to admin
    assert bob["qv8"].model_extra["parent"] == "base" and bob["base"].model_extra["parent"] is None
    alice = {m.id for m in _client(server, "k-alice").models.list().data}
    assert alice == {"base", "qv8", "mlp8"}
    admin = {m.id for m in _client(server, "k-admin").models.list().data}
    assert admin == {"base", "qv8", "mlp8", "secret"}


def test_a_key_cannot_use_an_adapter_it_does_not_own(lora_server):
    server, _, _ = lora_server
    for key in ("k-alice", "k-bob"):
        with pytest.raises(openai.PermissionDeniedError, match="may not use the LoRA adapter 'secret'"):
            _client(server, key).completions.create(model="secret", prompt="hi", max_tokens=1)
    with pytest.raises(openai.NotFoundError):
        _client(server, "k-alice").completions.create(model="nope", prompt="hi", max_tokens=1)
    done = _client(server, "k-admin").completions.create(model="secret", prompt="hi", max_tokens=1)
    assert done.usage.completion_tokens == 1


def test_anthropic_and_responses_routes_run_on_the_adapter(lora_server):
    server, _, _ = lora_server
    chat = _client(server, "k-alice").chat.completions.create
    msgs = [{"role": "user", "content": "hello there"}]
    on_adapter = chat(model="qv8", messages=msgs, max_tokens=MAX_TOKENS, temperature=0).choices[0].message.content
    on_base = chat(model="base", messages=msgs, max_tokens=MAX_TOKENS, temperature=0).choices[0].message.content
    assert on_adapter != on_base
    ant = anthropic.Anthropic(base_url=server.base_url, api_key="k-alice", max_retries=0)
    msg = ant.messages.create(model="qv8", max_tokens=MAX_TOKENS, messages=msgs, extra_body={"temperature": 0})
    assert msg.content[0].text == on_adapter
    resp = _client(server, "k-alice").responses.create(model="qv8", input="hello there", max_output_tokens=MAX_TOKENS,
                                                       temperature=0)
    assert resp.output_text == on_adapter
    with pytest.raises(anthropic.PermissionDeniedError):
        ant.messages.create(model="secret", max_tokens=1, messages=msgs)


def test_structured_output_and_n_choices_on_an_adapter(lora_server):
    server, refs, _ = lora_server
    schema = {"type": "object", "properties": {"pick": {"enum": ["red", "blue"]}}, "required": ["pick"],
              "additionalProperties": False}
    done = _client(server, "k-alice").chat.completions.create(
        model="qv8", messages=[{"role": "user", "content": "pick one"}], max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})
    assert json.loads(done.choices[0].message.content)["pick"] in ("red", "blue")
    # n = 3 greedy: the prompt is prefilled once and forked; every fork decodes on the adapter
    assert _text(server, "k-alice", "qv8", n=3) == [_decoded(server, refs["qv8"])] * 3


def test_runtime_load_and_unload_need_an_admin_key_that_owns_the_name(lora_server):
    server, refs, late = lora_server
    url = server.base_url + "/v1/"

    def post(route: str, key: str, **body) -> httpx.Response:
        return httpx.post(url + route, headers={"Authorization": f"Bearer {key}"}, json=body, timeout=60)

    assert post("load_lora_adapter", "k-alice", lora_name="late", lora_path=late).status_code == 403   # not admin
    t0 = time.perf_counter()
    r = post("load_lora_adapter", "k-admin", lora_name="late", lora_path=late)
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'late' added successfully."
    assert time.perf_counter() - t0 < 2.0
    assert _text(server, "k-alice", "late") == [_decoded(server, refs["late"])]
    bad = post("load_lora_adapter", "k-admin", lora_name="other", lora_path=str(late) + "-missing")
    assert bad.status_code == 400 and "adapter_config.json" in bad.json()["error"]["message"]
    assert post("load_lora_adapter", "k-admin", lora_name="late", lora_path=late).status_code == 400   # taken
    assert post("unload_lora_adapter", "k-alice", lora_name="late").status_code == 403
    assert post("unload_lora_adapter", "k-bob", lora_name="secret").status_code == 403
    r = post("unload_lora_adapter", "k-admin", lora_name="late")
    assert r.status_code == 200, r.text
    gone = httpx.post(url + "completions", headers={"Authorization": "Bearer k-alice"},
                      json={"model": "late", "prompt": "hi", "max_tokens": 1}, timeout=60)
    assert gone.status_code == 404
    assert post("unload_lora_adapter", "k-admin", lora_name="late").status_code == 404


def test_runtime_updates_are_off_unless_the_operator_enables_them(tmp_path, demo_model_dir):
    with ServerThread(lora_modules={}, runtime_lora_updates=False) as server:
        r = httpx.post(server.base_url + "/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/tmp"})
        assert r.status_code == 404 and "--allow-runtime-lora-updates" in r.json()["error"]["message"]
        paths = httpx.get(server.base_url + "/openapi.json").json()["paths"]
        assert {"/v1/load_lora_adapter", "/v1/unload_lora_adapter"} <= set(paths)


def test_ledger_usage_report_metrics_and_traces_name_the_adapter(lora_server):
    from prometheus_client.parser import text_string_to_metric_families

    from modelcall.events import RequestAdmitted
    from modelcall.plugins.ledger.plugin import ledger_of
    from modelcall.plugins.ledger.report import render, task_report
    from modelcall.plugins.ledger.store import open_readonly
    from modelcall.plugins.ledger.usage import summarize
    from modelcall.plugins.otel.attributes import request_attributes

    server, _, _ = lora_server
    for model in ("qv8", "base", "qv8"):
        r = httpx.post(server.base_url + "/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 2},
                       headers={"Authorization": "Bearer k-alice", "x-modelcall-task-id": "lora-task"}, timeout=60)
        assert r.status_code == 200, r.text
    observer, _ = ledger_of(server.kernel)
    deadline = time.monotonic() + 20
    while True:
        observer.flush()
        with open_readonly(server.ledger_path) as conn:
            rows = [dict(r) for r in conn.execute("SELECT * FROM requests WHERE task_id = 'lora-task' ORDER BY received")]
            if len(rows) == 3 and all(r["response_sent"] for r in rows) or time.monotonic() > deadline:
                by_lora = {g["lora"]: g for g in summarize(conn, "lora")}
                report = render(task_report(conn, "lora-task"))
                break
        time.sleep(0.05)
    assert [r["lora"] for r in rows] == ["qv8", None, "qv8"]
    assert by_lora["qv8"]["requests"] >= 2 and "-" in by_lora
    assert report.count("[LoRA qv8]") == 2
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(
        server.base_url + "/metrics", headers={"Authorization": "Bearer k-bob"}).text)}
    served = {s.labels["lora"]: s.value for s in families["modelcall:lora_requests"].samples
              if s.name.endswith("_total")}
    assert served["qv8"] >= 2 and "base" not in served
    admitted = RequestAdmitted(request_id="r", ts=0.0, model="base", prompt_tokens=1, max_tokens=1, lora="qv8")
    assert request_attributes(admitted, {"model": "qv8"}, "chat")["modelcall.lora"] == "qv8"
