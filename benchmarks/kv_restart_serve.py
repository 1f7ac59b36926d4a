"""KV tiers (issue 42), the restart with real processes: `modelcall serve` on a disk directory serves the
conversations of benchmarks/kv_tiers.py, gets SIGTERM, and is started again on the same directory; the TTFT of
its first request on a known prefix is set against a cold start of the same server on an empty directory.

Sizes, pool and flags as kv_tiers.py at --scale. The client streams through the openai SDK; the server is pinned
with `taskset -c CPUS`. Prints one JSON line and one table row.

    .venv/bin/python benchmarks/kv_restart_serve.py --model smollm2 --threads 1 --scale 4
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from openai import OpenAI

sys.path.insert(0, str(Path(__file__).parent))
from kv_tiers import OUTPUT, USER, conversations  # noqa: E402

SERVING = re.compile(r"modelcall: serving .* on (http://\S+)")


class Server:
    """One `modelcall serve` process; its stdout and stderr go to files in `logs` (no pipe to fill)."""

    def __init__(self, argv: list[str], logs: Path, name: str) -> None:
        self.model = argv[argv.index("--model") + 1]
        self.out, self.err = logs / f"{name}.out", logs / f"{name}.err"
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        self.url = self._wait_for_url(timeout_s=600)
        self.client = OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, timeout=600)

    def _wait_for_url(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if m := SERVING.search(self.out.read_text()):
                return m.group(1)
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited {self.proc.returncode} before serving:\n"
                                 f"{self.err.read_text()[-3000:]}")
            time.sleep(0.1)
        self.proc.kill()
        raise SystemExit(f"the server did not print its address within {timeout_s:.0f} s; see {self.err}")

    def ttft(self, ids: list[int]) -> tuple[float, str, int]:
        """Seconds from sending to the first streamed output chunk, the text, and the prompt's cached tokens."""
        t0 = time.perf_counter()
        first, text, cached = None, "", -1
        stream = self.client.completions.create(model=self.model, prompt=ids, max_tokens=OUTPUT, temperature=0,
                                                stream=True, stream_options={"include_usage": True},
                                                extra_body={"ignore_eos": True})
        for chunk in stream:
            if chunk.choices:
                first = first or time.perf_counter()
                text += chunk.choices[0].text
            if chunk.usage is not None:
                cached = chunk.usage.prompt_tokens_details.cached_tokens
        return first - t0, text, cached

    def tokenize(self, text: str) -> list[int]:
        r = httpx.post(self.url + "/tokenize", json={"prompt": text, "add_special_tokens": False}, timeout=60)
        return r.raise_for_status().json()["tokens"]

    def metric(self, name: str) -> float:
        body = httpx.get(self.url + "/metrics", timeout=60).raise_for_status().text
        m = re.search(rf"^modelcall:{name}(?:_total)?{{[^}}]*}} (\S+)$", body, re.M)
        return float(m.group(1)) if m else float("nan")

    def stop(self) -> tuple[int, float]:
        """SIGTERM, as a deploy stops it; the exit status and the seconds it took to exit."""
        t0 = time.perf_counter()
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=300)
        return rc, time.perf_counter() - t0


def serve_turns(server: Server, system: list[int], histories: list[list[int]], turns: int) -> list[list[int]]:
    """kv_tiers.serve_turns over HTTP: the same order and user messages. The output joins the context as the
    server tokenizes its text (the API returns text, not ids), so the context can differ from the in-process one."""
    rng = random.Random(1)
    contexts = [system + h for h in histories]
    server.ttft([7] * 8)
    for _ in range(turns):
        for ctx in contexts:
            ctx.extend(rng.randrange(100, 20000) for _ in range(USER))
            _, text, _ = server.ttft(ctx)
            ctx.extend(server.tokenize(text))
    return contexts


def first_request(server: Server, ids: list[int]) -> tuple[float, str, int, float, float]:
    """The TTFT on `ids`, its output and cached tokens (from disk too), and the TTFT of a 16-token prompt after
    it: the floor that HTTP, the step and the first token cost whatever the prefix."""
    server.ttft([7] * 8)   # first-call costs out of the figure, as kv_tiers.first_request
    t, text, cached = server.ttft(ids)
    floor, _, _ = server.ttft([13] * 16)
    return t, text, cached, server.metric("cached_prompt_tokens_disk"), floor


def block_files(directory: str) -> tuple[int, int, int]:
    """Block files, their bytes, and unfinished writes (.tmp) under the directory."""
    kv = [p for p in Path(directory).rglob("*.kv")]
    return len(kv), sum(p.stat().st_size for p in kv), len(list(Path(directory).rglob("*.tmp")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--scale", type=int, default=4, help="divide the issue's token and conversation counts by this")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--cpus", default="0", help="taskset -c for the server (default: 0)")
    a = ap.parse_args()
    n, system, history = 32 // a.scale, 1536 // a.scale, 512 // a.scale
    block = 16
    longest = system + history + a.turns * (USER + OUTPUT)
    num_blocks = (8 // a.scale or 1) * -(-longest // block) + 1
    system_ids, histories = conversations(n, system, history)
    work = Path(tempfile.mkdtemp(prefix="kv-restart-"))
    warm_dir, cold_dir = str(work / "warm"), str(work / "cold")
    exe = shutil.which("modelcall", path=str(Path(sys.executable).parent)) or "modelcall"

    def argv(directory: str) -> list[str]:
        return ["taskset", "-c", a.cpus, exe, "serve", "--model", a.model, "--threads", str(a.threads),
                "--block-size", str(block), "--num-kv-blocks", str(num_blocks), "--max-num-batched-tokens", "2048",
                "--kv-cache-dir", directory, "--port", "0", "--ledger", "off"]

    try:
        first = Server(argv(warm_dir), work, "first")
        contexts = serve_turns(first, system_ids, [list(h) for h in histories], a.turns)
        written = first.metric("kv_tier_disk_written_blocks")
        rc, exit_s = first.stop()
        files, disk_bytes, tmp = block_files(warm_dir)
        assert rc == 0, f"the server exited {rc} on SIGTERM; see {first.err}"
        assert tmp == 0 and files >= written, \
            f"{files} block files and {tmp} unfinished writes after exit, {written:.0f} blocks written before SIGTERM"
        known = contexts[0] + [11] * USER   # conversation 0 once more: its whole history is known

        restarted = Server(argv(warm_dir), work, "restarted")
        indexed, skipped = restarted.metric("kv_tier_disk_blocks"), restarted.metric("kv_tier_disk_skipped_files")
        warm_t, warm_text, cached, from_disk, floor = first_request(restarted, known)
        restarted.stop()
        cold = Server(argv(cold_dir), work, "cold")
        cold_t, cold_text, _, _, _ = first_request(cold, known)
        cold.stop()
        assert warm_text == cold_text, "greedy output differs after the restart"
    finally:
        shutil.rmtree(work, ignore_errors=True)
    row = {"bench": "kv_restart_serve", "model": a.model, "scale": a.scale, "prefix_tokens": len(known),
           "warm_ttft_ms": round(warm_t * 1e3, 1), "cold_ttft_ms": round(cold_t * 1e3, 1),
           "ratio": round(warm_t / cold_t, 3), "bar": 0.25,
           "floor_16_token_ttft_ms": round(floor * 1e3, 1), "cached_tokens": cached, "cached_disk_tokens": from_disk,
           "sigterm_exit": rc, "exit_s": round(exit_s, 2), "block_files": files, "written_before_sigterm": written,
           "indexed_at_restart": indexed, "skipped_at_restart": skipped, "disk_gb": round(disk_bytes / 1e9, 3),
           "load_avg": os.getloadavg()}
    print(json.dumps(row))
    print(f"| after `kill -TERM` and restart (real processes), first request on a known {len(known)}-token prefix / "
          f"a cold start | {warm_t * 1e3:,.0f} / {cold_t * 1e3:,.0f} ms = **{warm_t / cold_t:.3f}** (bar 0.25); "
          f"{cached} tokens cached, {from_disk:.0f} from disk; a 16-token prompt's TTFT {floor * 1e3:.0f} ms; "
          f"exit {rc} in {exit_s:.2f} s, {files} block files "
          f"({disk_bytes / 1e9:.3f} GB), {skipped:.0f} skipped at restart |")


if __name__ == "__main__":
    main()
