"""Pooling requests told apart from generation in every record (issue 40): one task that chats and embeds against a
decoder that does both (the demo Llama with sentence-transformers' last-token files), then the ledger's `kind`
column, `modelcall usage` (--by kind, and each group's pooling_tokens), `modelcall report` (each request's kind, input
by kind) and /metrics (prompt_tokens_by_kind) each show the embed tokens apart from the generate ones."""
from __future__ import annotations

import json
import re

import httpx
import pytest
from http_server import ServerThread
from pooling_models import llama_last_token

from modelcall.plugins.cli.main import main as cli
from modelcall.plugins.ledger.plugin import ledger_of
from modelcall.plugins.ledger.store import open_readonly

TASK = "rag-task-1"


def by_kind(base_url: str) -> dict[str, float]:
    text = httpx.get(base_url + "/metrics", timeout=10).text
    return {k: float(v) for k, v in re.findall(r'^modelcall:prompt_tokens_by_kind_total{kind="(\w+)",[^}]*} (\S+)$',
                                                 text, re.M)}


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """The task's calls (a chat completion, an embeddings call of 3 inputs) and what they reported."""
    model_dir = llama_last_token(tmp_path_factory.mktemp("decoder"))
    ledger = tmp_path_factory.mktemp("ledger") / "ledger.sqlite3"
    with ServerThread(model=model_dir, device="cpu", dtype="float32", served_model_name="both",
                      plugin_config={"ledger": {"path": str(ledger)}}) as server:
        assert server.kernel.task == "generate,embed"
        before = by_kind(server.base_url)
        headers = {"x-modelcall-task-id": TASK}
        chat = httpx.post(server.base_url + "/v1/chat/completions", headers=headers, timeout=60, json={
            "model": "both", "messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 4}).json()
        emb = httpx.post(server.base_url + "/v1/embeddings", headers=headers, timeout=60, json={
            "model": "both", "input": ["a passage about cats", "one on dogs", "and birds"]}).json()
        after = by_kind(server.base_url)
        ledger_of(server.kernel)[0].flush()
        yield {"ledger": str(ledger), "chat_prompt": chat["usage"]["prompt_tokens"],
               "embed_prompt": emb["usage"]["prompt_tokens"],
               "metrics": {k: after.get(k, 0) - before.get(k, 0) for k in after}}


def test_the_ledger_marks_each_row_with_its_kind(task):
    with open_readonly(task["ledger"]) as conn:
        rows = conn.execute("SELECT kind, prompt_tokens, completion_tokens FROM requests WHERE task_id = ?",
                            (TASK,)).fetchall()
    kinds = sorted(r[0] for r in rows)
    assert kinds == ["embed", "embed", "embed", "generate"], kinds
    assert sum(r[1] for r in rows if r[0] == "embed") == task["embed_prompt"]
    assert [r[1] for r in rows if r[0] == "generate"] == [task["chat_prompt"]]
    assert all(r[2] == 0 for r in rows if r[0] == "embed")


def test_metrics_count_prompt_tokens_by_kind(task):
    assert task["metrics"] == {"generate": task["chat_prompt"], "embed": task["embed_prompt"], "score": 0}


def test_usage_by_kind_and_each_groups_pooling_tokens(task, capsys):
    assert cli(["usage", "--ledger", task["ledger"], "--by", "kind", "--json"]) == 0
    rows = {r["kind"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"embed", "generate"}
    assert (rows["embed"]["requests"], rows["embed"]["prompt_tokens"], rows["embed"]["completion_tokens"]) == (
        3, task["embed_prompt"], 0)
    assert rows["generate"]["prompt_tokens"] == task["chat_prompt"] and rows["generate"]["pooling_tokens"] == 0
    assert cli(["usage", "--ledger", task["ledger"], "--by", "model"]) == 0
    table = capsys.readouterr().out
    header, row = table.splitlines()[:2]
    assert header.split()[-1] == "pooling_tokens" and row.split()[-1] == str(task["embed_prompt"])


def test_the_tasks_report_splits_its_input_by_kind(task, capsys):
    assert cli(["report", TASK, "--ledger", task["ledger"], "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["cost"]["input_tokens_by_kind"] == {"generate": task["chat_prompt"], "embed": task["embed_prompt"]}
    assert sorted(s["kind"] for s in rep["saw"]) == ["embed", "embed", "embed", "generate"]
    assert cli(["report", TASK, "--ledger", task["ledger"]]) == 0
    text = capsys.readouterr().out
    assert text.count("(embed):") == 3
    assert f"input by kind: embed {task['embed_prompt']}, generate {task['chat_prompt']}" in text
