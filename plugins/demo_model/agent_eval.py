"""Score a served demo model on the hand-written split through the real `modelcall agent` command, one task per
question, greedy, the two demo tools offered (docs/demo-model.md reports what this prints):

    modelcall serve --model trained --port 8000 &
    python -m modelcall.plugins.demo_model.agent_eval --base-url http://127.0.0.1:8000

The agent demo (SmolLM2 with its LoRA adapter served as `demo`, docs/demo-model.md): add `--model demo`.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from modelcall.plugins.demo_model import evalset

TOOLS = ["modelcall.plugins.demo_model.tools:calculator", "modelcall.plugins.demo_model.tools:get_weather"]


def ask(base_url: str, question: str, model: str | None = None) -> dict[str, Any]:
    """One `modelcall agent --json` task (the CLI itself, as a user runs it); its TaskResult as a dict.
    `model`: the served name to ask (a LoRA adapter's, for the agent demo), else the server's model."""
    exe = os.path.join(os.path.dirname(sys.executable), "modelcall")
    named = ["--model", model] if model else []
    out = subprocess.run([exe, "agent", "--base-url", base_url, "--tools", *TOOLS, "--json", "--max-turns", "3",
                          *named, "--param", "temperature=0", "--param", "max_tokens=80", question],
                         capture_output=True, text=True, timeout=300)
    if not out.stdout.strip():
        raise RuntimeError(f"modelcall agent printed nothing for {question!r}: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def score(base_url: str, rows: list[dict[str, Any]], workers: int = 2,
          model: str | None = None) -> tuple[dict[str, Any], list[dict]]:
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda r: ask(base_url, r["question"], model), rows))
    verdicts, wrong = [], []
    for row, res in zip(rows, results):
        calls = [evalset.Call(c["name"], c["arguments"], c["status"], c["result"]) for c in res["tool_calls"]]
        v = evalset.judge(row, calls, res["answer"], res["status"])
        verdicts.append(v)
        if not v.right:
            wrong.append({"question": row["question"], "calls": [[c.name, c.arguments, c.result] for c in calls],
                          "answer": res["answer"], "status": res["status"]})
    return evalset.summary(rows, verdicts), wrong


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", help="the served model name to ask (e.g. the agent demo's adapter, `demo`)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--every", type=int, default=1, metavar="N", help="every Nth question only (a quick look)")
    a = p.parse_args(argv)
    summary, wrong = score(a.base_url, evalset.load()[::a.every], a.workers, a.model)
    print(json.dumps({"summary": summary, "wrong": wrong}, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
