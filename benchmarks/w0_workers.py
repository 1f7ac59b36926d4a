"""One engine, in process, timing one stream at a time for W0 (benchmarks/w0_single_stream.py drives it).

    python benchmarks/w0_workers.py llama.cpp|modelcall FILE.gguf THREADS CONTEXT

Loads the file once, then answers JSON commands on stdin, one a line, with one `@@ {json}` line on stdout each
(other output of the engines goes to stderr):

    {"op": "tokenize", "text": "..."}                 -> {"ids": [...]}
    {"op": "run", "prompt_ids": [...], "new": 256}    -> {"ttft_s", "total_s", "tokens", "text"}

Both engines: greedy, end of sequence banned (llama.cpp: its native sampler chain, a logit bias of -100 on every
end-of-generation token then greedy, in llama-cli's loop; modelcall: ignore_eos), no prompt reuse between runs
(llama.cpp: reset(); modelcall: prefix cache reset), TTFT
= first streamed token, the prompt token ids given as they are (no BOS added). Runs under the llama.cpp peer's
venv or modelcall's, so nothing but the standard library is imported at the top.
"""
from __future__ import annotations

import json
import os
import sys
import time


class LlamaCpp:
    def __init__(self, file: str, threads: int, context: int) -> None:
        import llama_cpp
        self.llm = llama_cpp.Llama(file, n_threads=threads, n_threads_batch=threads, n_ctx=context, verbose=False)
        vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.banned = {i: -100.0 for i in range(self.llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, i)}

    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode(), add_bos=False, special=False)

    def run(self, prompt_ids: list[int], new: int) -> dict:
        """llama.cpp's own loop, as llama-cli runs it: one prefill decode, then per token the native sampler
        chain (logit bias banning end of generation, then greedy: no Python logits processor copying the
        vocabulary each token, which is what create_completion(logit_bias=...) does) and one decode."""
        from llama_cpp._internals import LlamaSampler
        self.llm.reset()
        sampler = LlamaSampler()
        sampler.add_logit_bias(self.llm.n_vocab(), self.banned)
        sampler.add_greedy()
        made: list[int] = []
        t = time.perf_counter()
        self.llm.eval(prompt_ids)
        first = None
        while len(made) < new:
            token = sampler.sample(self.llm._ctx, -1)
            sampler.accept(token)
            made.append(token)
            first = first or time.perf_counter()
            if len(made) < new:
                self.llm.eval([token])
        end = time.perf_counter()
        sampler.close()
        text = self.llm.detokenize(made).decode(errors="replace")
        return {"ttft_s": first - t, "total_s": end - t, "tokens": len(made), "text": text}


class Modelcall:
    """The kernel lives in one event loop (its engine task group must be entered and left by the same task), so
    this worker's command loop runs inside it, reading stdin on a thread."""

    def __init__(self, file: str, threads: int, context: int) -> None:
        self.args = (file, threads)

    def tokenize(self, text: str) -> list[int]:
        raise NotImplementedError("W0 tokenizes with llama.cpp and hands both engines the same ids")

    def serve(self, out) -> None:
        import anyio
        anyio.run(self._serve, out)

    async def _serve(self, out) -> None:
        import anyio.to_thread
        from modelcall.core import Kernel
        file, threads = self.args
        runner = json.loads(os.environ.get("MODELCALL_BENCH_RUNNER") or "{}")   # gguf_peer.runner_config
        async with Kernel(model=file, threads=threads, plugin_config={"runner": runner}) as self.kernel:
            reply(out, {"ready": True})
            while line := await anyio.to_thread.run_sync(sys.stdin.readline):
                cmd = json.loads(line)
                reply(out, await self._run(cmd["prompt_ids"], cmd["new"]) if cmd["op"] == "run" else self.other(cmd))

    def other(self, cmd: dict) -> dict:
        return {"error": f"unknown op {cmd['op']!r}"}

    async def _run(self, prompt_ids: list[int], new: int) -> dict:
        from modelcall.core import SamplingParams
        from modelcall.events import TokensEmitted
        self.kernel.kv.reset_prefix_cache()
        params = SamplingParams.create(max_tokens=new, temperature=0, ignore_eos=True)
        t = time.perf_counter()
        first, pieces, tokens = None, [], 0
        async for event in self.kernel.generate(prompt_token_ids=list(prompt_ids), params=params):
            if isinstance(event, TokensEmitted) and event.token_ids:
                first = first or time.perf_counter()
                tokens += len(event.token_ids)
                pieces.append(event.text)
        end = time.perf_counter()
        return {"ttft_s": first - t, "total_s": end - t, "tokens": tokens, "text": "".join(pieces)}


def reply(out, answer: dict) -> None:
    out.write("@@ " + json.dumps(answer) + "\n")
    out.flush()


def serve_llama(worker: LlamaCpp, out) -> None:
    reply(out, {"ready": True})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "tokenize":
            reply(out, {"ids": worker.tokenize(cmd["text"])})
        elif cmd["op"] == "run":
            reply(out, worker.run(cmd["prompt_ids"], cmd["new"]))
        else:
            reply(out, {"error": f"unknown op {cmd['op']!r}"})


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[0] not in ("llama.cpp", "modelcall"):
        print(__doc__, file=sys.stderr)
        return 2
    engine, file, threads, context = argv[0], argv[1], int(argv[2]), int(argv[3])
    out = sys.stdout
    sys.stdout = sys.stderr   # the engines' own prints stay off the answer channel
    if engine == "llama.cpp":
        serve_llama(LlamaCpp(file, threads, context), out)
    else:
        Modelcall(file, threads, context).serve(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
