"""Per-token cost of the core output stage, as ratios to the detokenizer alone (measured in this run).

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/output_stage.py

Configurations: plain (no stop strings, no parsers, no filters: what most requests pay), stop
strings, a chat request with the reasoning parser and the tool-call parser, and the same with the
built-in blocklist + PII filters and logprobs. Text: the demo tokenizer's tokens of stdlib source.
"""
from __future__ import annotations

import inspect
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from modelcall.core import Request, SamplingParams  # noqa: E402
from modelcall.core.output import OutputState  # noqa: E402
from modelcall.core.safety import output_filters  # noqa: E402
from modelcall.core.tools import ToolCallStream  # noqa: E402
from modelcall.events import PositionLogprobs, TokenLogprob  # noqa: E402
from modelcall.plugins.demo_model import demo_model_dir  # noqa: E402
from modelcall.plugins.reasoning.think import ThinkParser, tag_ids  # noqa: E402
from modelcall.plugins.safety.blocklist import Blocklist  # noqa: E402
from modelcall.plugins.safety.pii import PiiRedactor  # noqa: E402
from modelcall.plugins.tokenizer_hf import HFTokenizer  # noqa: E402
from modelcall.plugins.tool_parsers.hermes import HermesParser  # noqa: E402

N = 4000


def run(tok: HFTokenizer, ids: list[int], make) -> float:  # noqa: ANN001
    params = SamplingParams.create(stop=make.get("stop"), max_tokens=len(ids) + 1)
    req = Request("r", [1], params, max_tokens=len(ids) + 1)
    out = make["state"](tok, req, params)
    lp = make.get("logprob")
    t0 = time.perf_counter()
    for t in ids:
        req.all_token_ids.append(t)
        out.on_token(req, t, 1 << 30, lp)
    return (time.perf_counter() - t0) / len(ids)


def main() -> None:
    tok = HFTokenizer(demo_model_dir())
    ids = tok.encode(inspect.getsource(inspect))[:N]
    start, end = tag_ids(tok)
    filters = [("blocklist", Blocklist(["launch code"])), ("pii", PiiRedactor())]

    def detok_only() -> float:
        d = tok.detokenizer([1])
        t0 = time.perf_counter()
        for t in ids:
            d.push((t,))
        return (time.perf_counter() - t0) / len(ids)

    configs = {
        "plain": {"state": lambda tok, req, p: OutputState(tok.detokenizer([1]))},
        "stop strings (3)": {"stop": ("\nQQQ", "###", "</answer>"),
                             "state": lambda tok, req, p: OutputState(tok.detokenizer([1]), p.stop)},
        "reasoning + tools": {"state": lambda tok, req, p: OutputState(
            tok.detokenizer([1]), reasoning=ThinkParser(start, end), tools=ToolCallStream(HermesParser(), "r", None))},
        "reasoning + tools + filters + logprobs": {
            "logprob": PositionLogprobs(5, -0.1, (TokenLogprob(5, -0.1), TokenLogprob(6, -2.0))),
            "state": lambda tok, req, p: OutputState(
                tok.detokenizer([1]), reasoning=ThinkParser(start, end), tools=ToolCallStream(HermesParser(), "r", None),
                filters=output_filters(filters, req, lambda i: tok.decode([i])))},
    }
    base = min(detok_only() for _ in range(3))
    print(f"detokenizer alone: {base * 1e6:.2f} us/token ({len(ids)} tokens)")
    for name, make in configs.items():
        t = min(run(tok, ids, make) for _ in range(3))
        print(f"{name:40s} {t * 1e6:7.2f} us/token  {t / base:5.1f}x the detokenizer")


if __name__ == "__main__":
    main()
