"""Mask time of the grammar engines on CPU: llguidance vs xgrammar (whichever is installed).

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/grammar_engines.py [--tokenizer DIR_OR_JSON]

For each engine: the one-off tokenizer set-up, the compile time of one tool-argument schema
(paid per request when schemas differ, as tool sets do), and the time to compute one token mask
at each position of a schema-valid output (mean, median, p90, max). Default tokenizer: a 32,000-
token byte-level BPE trained here on the Python standard library (the W1 vocabulary size).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import tempfile
import time

SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 400}, "unit": {"enum": ["c", "f"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 14},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
    "required": ["city", "unit", "days", "tags"], "additionalProperties": False}
DOC = json.dumps({"city": "San Francisco, California", "unit": "c", "days": 7, "tags": ["a", "bb"]})


def train_tokenizer(path: str) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    files = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "**", "*.py"), recursive=True))[:1500]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    def texts():
        for f in files:
            try:
                with open(f, encoding="utf-8") as fh:
                    yield fh.read()
            except (UnicodeDecodeError, OSError):
                continue
    tok.train_from_iterator(texts(), trainers.BpeTrainer(vocab_size=32000, special_tokens=["<|endoftext|>"], show_progress=False,
                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(path)


def stats(ts: list[float]) -> str:
    us = sorted(t * 1e6 for t in ts)
    return (f"mean {statistics.mean(us):.0f} µs, median {statistics.median(us):.0f}, "
            f"p90 {us[int(0.9 * len(us))]:.0f}, max {us[-1]:.0f}")


def bench_llguidance(path: str, ids: list[int]) -> None:
    import llguidance
    import llguidance.torch as lt
    t0 = time.perf_counter()
    tok = llguidance.LLTokenizer(open(path).read(), eos_token=0)
    setup = time.perf_counter() - t0
    t0 = time.perf_counter()
    opts = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    m = llguidance.LLMatcher(tok, llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults=opts))
    compile_s = time.perf_counter() - t0
    bm = lt.allocate_token_bitmask(1, tok.vocab_size)
    ts = []
    for t in ids:
        t0 = time.perf_counter()
        lt.fill_next_token_bitmask(m, bm, 0)
        ts.append(time.perf_counter() - t0)
        assert m.consume_token(t), m.get_error()
    print(f"llguidance {llguidance.__version__ if hasattr(llguidance, '__version__') else ''}: tokenizer "
          f"{setup * 1e3:.0f} ms, compile {compile_s * 1e3:.1f} ms, mask {stats(ts)}")


def bench_xgrammar(path: str, ids: list[int]) -> None:
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast
    hf = PreTrainedTokenizerFast(tokenizer_file=path, eos_token="<|endoftext|>")
    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=len(hf))
    comp = xgr.GrammarCompiler(info, max_threads=1)
    setup = time.perf_counter() - t0
    t0 = time.perf_counter()
    cg = comp.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False, strict_mode=True)
    compile_s = time.perf_counter() - t0
    m = xgr.GrammarMatcher(cg)
    bm = xgr.allocate_token_bitmask(1, info.vocab_size)
    ts = []
    for t in ids[:-1]:
        t0 = time.perf_counter()
        m.fill_next_token_bitmask(bm, 0)
        ts.append(time.perf_counter() - t0)
        assert m.accept_token(t)
    print(f"xgrammar: tokenizer {setup * 1e3:.0f} ms, compile {compile_s * 1e3:.1f} ms, mask {stats(ts)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", help="a tokenizer.json or a model directory holding one")
    args = ap.parse_args()
    path = args.tokenizer
    if path and os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    if not path:
        path = os.path.join(tempfile.mkdtemp(), "tokenizer.json")
        train_tokenizer(path)
    from tokenizers import Tokenizer
    ids = Tokenizer.from_file(path).encode(DOC).ids + [0]
    print(f"{len(ids)} tokens of schema-valid output")
    for bench in (bench_llguidance, bench_xgrammar):
        try:
            bench(path, ids)
        except ImportError as e:
            print(f"{bench.__name__[6:]}: not installed ({e.name})")


if __name__ == "__main__":
    main()
