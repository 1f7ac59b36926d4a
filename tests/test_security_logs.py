"""Log capture: at the default level `modelcall serve` logs one JSON line per request, and never a prompt,
an output, a tool argument, an Authorization header or any key material."""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx
from keys_util import write_keys

from modelcall.events import Finished, RequestAdmitted, Timings, ToolRequested, Usage
from modelcall.plugins.reqlog.plugin import RequestLog

MODELCALL = str(Path(sys.executable).parent / "modelcall")
KEY = "mc-live-key-TOPSECRET-7f3a9"
WRONG = "mc-wrong-key-ALSOSECRET-1b2c"
PROMPT = "PURPLE-ELEPHANT-PROMPT-4242 tell me about rivers"
SYSTEM = "SYSTEM-SECRET-INSTRUCTIONS-9911"


def test_default_logs_hold_no_prompt_output_or_key_material(tmp_path):
    keys = write_keys(tmp_path / "keys.toml", {KEY: {"name": "team-a"}})
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.Popen([MODELCALL, "serve", "--port", "0", "--api-keys", str(keys), "--ledger", "off",
                             "--dtype", "float32", "--threads", "1", "--num-kv-blocks", "256", "--max-model-len", "256"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        base = None
        for _ in range(400):
            line = proc.stdout.readline()
            m = re.search(r"on (http://\S+)", line or "")
            if m:
                base = m.group(1)
                break
        assert base, "server did not start"
        h = {"Authorization": f"Bearer {KEY}"}
        model = httpx.get(base + "/v1/models", headers=h).json()["data"][0]["id"]
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}]
        outputs = []
        b = httpx.post(base + "/v1/chat/completions", headers=h, timeout=60,
                       json={"model": model, "messages": msgs, "max_tokens": 12, "temperature": 0}).json()
        outputs.append(b["choices"][0]["message"]["content"] or "")
        b = httpx.post(base + "/v1/messages", headers={"x-api-key": KEY}, timeout=60,
                       json={"model": model, "max_tokens": 12, "system": SYSTEM,
                             "messages": [{"role": "user", "content": PROMPT}]}).json()
        outputs.append("".join(c.get("text", "") for c in b["content"]))
        assert httpx.post(base + "/v1/chat/completions", headers={"Authorization": f"Bearer {WRONG}"},
                          json={"model": model, "messages": msgs}).status_code == 401
        assert httpx.post(base + "/v1/messages", headers={"x-api-key": WRONG},
                          json={"model": model, "max_tokens": 4, "messages": msgs[1:]}).status_code == 401
        r = httpx.post(base + "/v1/chat/completions", headers=h,
                       json={"model": model, "messages": msgs, "max_tokens": 10**6})
        assert r.status_code == 400
        time.sleep(0.5)
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    lines = [json.loads(ln.split("modelcall.requests: ", 1)[1]) for ln in err.splitlines() if "modelcall.requests: " in ln]
    assert sorted(ln["status"] for ln in lines) == [200, 200, 400, 401, 401]
    assert all(ln.get("caller") == "team-a" for ln in lines if ln["status"] == 200)
    forbidden = [KEY, WRONG, hashlib.sha256(KEY.encode()).hexdigest(), hashlib.sha256(WRONG.encode()).hexdigest(),
                 "Bearer", "PURPLE-ELEPHANT", SYSTEM, "rivers"]
    forbidden += [o for o in outputs if len(o.strip()) >= 8]
    for secret in forbidden:
        assert secret not in err, f"{secret[:12]}… appeared in the server log"


def test_text_is_logged_only_when_the_deployment_enables_it(tmp_path):
    for include in (False, True):
        path = tmp_path / f"log-{include}.jsonl"
        log = RequestLog(str(path), include_text=include)
        log.handle(RequestAdmitted(request_id="r", model="m", prompt_tokens=3, max_tokens=4, caller="k"))
        log.handle(ToolRequested(request_id="r", call_id="c1", name="search", arguments='{"q": "ARGS-SECRET"}'))
        log.handle(Finished(request_id="r", reason="tool_calls", usage=Usage(prompt_tokens=3, completion_tokens=4),
                            timings=Timings(received=0.0, finished=1.0), text="OUTPUT-TEXT"))
        log.close()
        [line] = [json.loads(x) for x in path.read_text().splitlines()]
        assert line["tool_calls"][0]["name"] == "search" and line["completion_tokens"] == 4
        text = path.read_text()
        assert ("ARGS-SECRET" in text) is include and ("OUTPUT-TEXT" in text) is include


def test_a_request_on_a_lora_adapter_is_logged_with_the_adapter(tmp_path):
    """The line names the adapter a request ran on beside the base model (issue 39's records); the base alone: none."""
    path = tmp_path / "log.jsonl"
    log = RequestLog(str(path), include_text=False)
    for rid, lora in (("a", "sql-adapter"), ("b", None)):
        log.handle(RequestAdmitted(request_id=rid, model="smollm2", prompt_tokens=3, max_tokens=4, lora=lora))
        log.handle(Finished(request_id=rid, reason="stop", usage=Usage(prompt_tokens=3, completion_tokens=1),
                            timings=Timings(received=0.0, finished=1.0)))
    log.close()
    a, b = [json.loads(x) for x in path.read_text().splitlines()]
    assert (a["model"], a["lora"]) == ("smollm2", "sql-adapter")
    assert b["model"] == "smollm2" and "lora" not in b
