"""`modelcall report TASK_ID`: the four answers for one task, from the ledger.

1. what the model saw  — prompt tokens by part, per request
2. where the time went — admission, queue, prefill, decode, streaming per request; tools and
   other app time between requests. The spans of each request add up to its wall time, and
   requests plus gaps add up to the task's wall time (requests that ran at the same time add
   a negative `overlap`, so their shared time is counted once).
3. whether it completed — every request's finish reason
4. what it cost        — input (of which cached) and output (of which reasoning); cached and
   reasoning tokens are parts of input and output, never added on top. Input tokens are also
   split by kind: generation, or pooling requests (embed, score: a RAG task's retrieval).
"""
from __future__ import annotations

import json
import sqlite3
from typing import Any

SPANS = ("admission", "queue", "prefill", "decode", "streaming")


def _span(a: float | None, b: float | None) -> float:
    return 0.0 if a is None or b is None else b - a


def request_spans(r: dict[str, Any]) -> dict[str, float]:
    """Each request's wall time split where it was measured; the spans sum to `end - received`."""
    end = r["response_sent"] or r["finished"]
    marks = [r["received"], r["admitted"], r["scheduled"], r["first_token"], r["last_token"], end]
    # A request refused or aborted early skips stages: carry the last known mark forward.
    for i in range(1, len(marks)):
        if marks[i] is None:
            marks[i] = marks[i - 1]
    return {name: _span(marks[i], marks[i + 1]) for i, name in enumerate(SPANS)}


def task_report(conn: sqlite3.Connection, task_id: str) -> dict[str, Any]:
    conn.row_factory = sqlite3.Row
    reqs = [dict(r) for r in conn.execute(
        "SELECT * FROM requests WHERE task_id = ? ORDER BY COALESCE(received, finished), rowid", (task_id,))]
    if not reqs:
        raise LookupError(f"the ledger has no requests of task {task_id!r}")
    tools = [dict(r) for r in conn.execute(
        "SELECT * FROM tool_calls WHERE task_id = ? ORDER BY COALESCE(requested, done)", (task_id,))]
    tools_by_request: dict[str, list[dict]] = {}
    for t in tools:
        tools_by_request.setdefault(t["request_id"], []).append(t)

    saw, timeline, outcomes = [], [], []
    totals = dict.fromkeys(SPANS, 0.0) | {"tools": 0.0, "other": 0.0}
    for i, r in enumerate(reqs):
        parts = json.loads(r["prompt_parts"]) if r["prompt_parts"] else {"prompt": r["prompt_tokens"]}
        saw.append({"request_id": r["request_id"], "kind": r["kind"], "lora": r["lora"], "prompt_tokens": r["prompt_tokens"],
                    "parts": parts, "dropped_messages": r["dropped_messages"]})
        spans = request_spans(r)
        for k, v in spans.items():
            totals[k] += v
        entry: dict[str, Any] = {"request_id": r["request_id"], **spans,
                                 "total": sum(spans.values()),
                                 # the engine's first token, on the server's clock; the client's first
                                 # event and first content text are the client's to measure (not here)
                                 "engine_first_token": (None if r["first_token"] is None or r["received"] is None
                                                        else r["first_token"] - r["received"])}
        if i + 1 < len(reqs):
            end = r["response_sent"] or r["finished"]
            gap = _span(end, reqs[i + 1]["received"])
            if gap >= 0:
                tool_s = sum(t["duration_s"] or 0.0 for t in tools_by_request.get(r["request_id"], ()))
                entry["after"] = {"tools": tool_s, "other": gap - tool_s, "total": gap}
                totals["tools"] += tool_s
                totals["other"] += gap - tool_s
            else:  # the next request began before this one ended: their time overlaps, counted once
                entry["after"] = {"overlap": -gap, "total": gap}
                totals["overlap"] = totals.get("overlap", 0.0) + gap
        timeline.append(entry)
        outcomes.append({"request_id": r["request_id"], "status": r["status"], "finish_reason": r["finish_reason"],
                         "error": r["error"], "retries": r["retries"], "preemptions": r["preemptions"],
                         "tool_calls": [{"call_id": t["call_id"], "name": t["name"], "outcome": t["outcome"],
                                         "error": t["error"], "duration_s": t["duration_s"]}
                                        for t in tools_by_request.get(r["request_id"], ())]})
    first, last = reqs[0], reqs[-1]
    wall = _span(first["received"], last["response_sent"] or last["finished"])
    last_reason = last["finish_reason"]
    completed = last["status"] == 200 and last_reason == "stop"
    cost_in = sum(r["prompt_tokens"] for r in reqs)
    cached = sum(r["cached_tokens"] for r in reqs)
    cost_out = sum(r["completion_tokens"] for r in reqs)
    reasoning = sum(r["reasoning_tokens"] for r in reqs)
    by_kind: dict[str, int] = {}
    for r in reqs:
        by_kind[r["kind"] or "-"] = by_kind.get(r["kind"] or "-", 0) + r["prompt_tokens"]
    return {
        "task_id": task_id,
        "requests": len(reqs),
        "saw": saw,
        "time": {"wall": wall, "by_stage": totals, "requests": timeline},
        "completed": {"completed": completed, "last_finish_reason": last_reason, "requests": outcomes},
        "cost": {"input_tokens": cost_in, "cached_input_tokens": cached, "uncached_input_tokens": cost_in - cached,
                 "output_tokens": cost_out, "reasoning_tokens": reasoning, "visible_output_tokens": cost_out - reasoning,
                 "total_tokens": cost_in + cost_out, "input_tokens_by_kind": by_kind},
    }


def _ms(s: float) -> str:
    return f"{s * 1000:9.1f} ms"


def render(rep: dict[str, Any]) -> str:
    out = [f"task {rep['task_id']}: {rep['requests']} model request(s)", "", "1. What the model saw (prompt tokens by part)"]
    for s in rep["saw"]:
        parts = ", ".join(f"{k} {v}" for k, v in s["parts"].items() if v)
        dropped = f"; {s['dropped_messages']} old message(s) dropped to fit" if s["dropped_messages"] else ""
        kind = f" ({s['kind']})" if s["kind"] not in (None, "generate") else ""
        kind += f" [LoRA {s['lora']}]" if s.get("lora") else ""
        out.append(f"   {s['request_id']}{kind}: {s['prompt_tokens']} = {parts}{dropped}")
    t = rep["time"]
    out += ["", f"2. Where the time went (wall {_ms(t['wall']).strip()})"]
    for r in t["requests"]:
        out.append(f"   {r['request_id']}: " + ", ".join(f"{k} {_ms(r[k]).strip()}" for k in SPANS)
                   + f" = {_ms(r['total']).strip()}")
        if r.get("engine_first_token") is not None:
            out.append(f"     engine first token {_ms(r['engine_first_token']).strip()} after received "
                       "(client first event / first content text: see the client, e.g. `modelcall bench serve`)")
        a = r.get("after")
        if a is not None and "overlap" in a:
            out.append(f"     overlaps the next request by {_ms(a['overlap']).strip()}")
        elif a is not None:
            out.append(f"     then tools {_ms(a['tools']).strip()}, other app time {_ms(a['other']).strip()}"
                       f" = {_ms(a['total']).strip()}")
    out.append("   by stage: " + ", ".join(f"{k} {_ms(v).strip()}" for k, v in t["by_stage"].items())
               + f" = {_ms(sum(t['by_stage'].values())).strip()}")
    c = rep["completed"]
    out += ["", f"3. Completed: {'yes' if c['completed'] else 'no'} (last finish reason: {c['last_finish_reason']})"]
    for r in c["requests"]:
        calls = ", ".join(f"{x['name']}→{x['outcome']}" for x in r["tool_calls"])
        extra = f"; tools: {calls}" if calls else ""
        err = f"; error: {r['error']}" if r["error"] else ""
        out.append(f"   {r['request_id']}: {r['finish_reason']} (status {r['status']}){extra}{err}")
    k = rep["cost"]
    out += ["", "4. What it cost (tokens)",
            f"   input  {k['input_tokens']:8d}  (cached {k['cached_input_tokens']}, uncached {k['uncached_input_tokens']})",
            f"   output {k['output_tokens']:8d}  (reasoning {k['reasoning_tokens']}, visible {k['visible_output_tokens']})",
            f"   total  {k['total_tokens']:8d}  (= input + output; cached and reasoning are parts, not extra)"]
    kinds = k["input_tokens_by_kind"]
    if set(kinds) - {"generate"}:   # a task that embedded or scored: its input split by kind
        out.append("   input by kind: " + ", ".join(f"{name} {n}" for name, n in sorted(kinds.items())))
    return "\n".join(out)
