"""Per-replica series for the one /metrics: counted in the front end from the events each replica
streams back (exact, no scrape of the replicas), plus each replica's kernel gauges when scraped, and
its meters' gauges under their own names with a `replica` label (e.g. `modelcall:quota_store_up`:
the replicas charge the quota store, the front end does not)."""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from modelcall.events import Finished, RequestAdmitted, RequestFailed, TokensEmitted

P = "modelcall:replica_"


class ReplicaSeries:
    def __init__(self) -> None:
        self.requests: dict[str, int] = defaultdict(int)
        self.prompt_tokens: dict[str, int] = defaultdict(int)
        self.cached_tokens: dict[str, int] = defaultdict(int)
        self.generation_tokens: dict[str, int] = defaultdict(int)
        self.finished: dict[tuple[str, str], int] = defaultdict(int)
        self.failed: dict[str, int] = defaultdict(int)

    def observe(self, replica: str, ev: Any) -> None:
        t = type(ev)
        if t is TokensEmitted:
            self.generation_tokens[replica] += len(ev.token_ids)
        elif t is RequestAdmitted:
            self.requests[replica] += 1
        elif t is Finished:
            self.finished[(replica, ev.reason)] += 1
            self.prompt_tokens[replica] += ev.usage.prompt_tokens
            self.cached_tokens[replica] += ev.usage.cached_tokens
        elif t is RequestFailed:
            self.failed[replica] += 1

    def exposition(self, model: str, gauges: dict[str, dict] | None = None) -> bytes:
        """Prometheus text: counters by replica, and `gauges` (replica id -> kernel stats) when given."""
        out: list[str] = []

        def family(name: str, kind: str, doc: str, rows: list[tuple[dict[str, str], float]], prefix: str = P) -> None:
            out.append(f"# HELP {prefix}{name} {doc}\n# TYPE {prefix}{name} {kind}\n")
            for labels, v in rows:
                lab = ",".join(f'{k}="{val}"' for k, val in {"model_name": model, **labels}.items())
                out.append(f"{prefix}{name}{{{lab}}} {float(v)}\n")

        family("requests_total", "counter", "Requests admitted by each replica.",
               [({"replica": r}, n) for r, n in sorted(self.requests.items())])
        family("prompt_tokens_total", "counter", "Prompt tokens of finished requests, by replica.",
               [({"replica": r}, n) for r, n in sorted(self.prompt_tokens.items())])
        family("cached_tokens_total", "counter", "Prompt tokens read from the replica's prefix cache.",
               [({"replica": r}, n) for r, n in sorted(self.cached_tokens.items())])
        family("generation_tokens_total", "counter", "Tokens generated, by replica.",
               [({"replica": r}, n) for r, n in sorted(self.generation_tokens.items())])
        family("finished_total", "counter", "Finished requests by replica and reason.",
               [({"replica": r, "reason": why}, n) for (r, why), n in sorted(self.finished.items())])
        family("failed_total", "counter", "Requests that failed on (or with) a replica.",
               [({"replica": r}, n) for r, n in sorted(self.failed.items())])
        if gauges:
            for key, doc in (("running", "Sequences running on the replica."),
                             ("waiting", "Requests waiting on the replica."),
                             ("unfinished", "Requests admitted and not finished on the replica.")):
                family(key, "gauge", doc, [({"replica": r}, s.get(key, 0)) for r, s in sorted(gauges.items())])
            kv_rows = []
            for r, s in sorted(gauges.items()):
                for k, v in (s.get("kv") or {}).items():
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        kv_rows.append(({"replica": r, "stat": k}, v))
            family("kv", "gauge", "The replica's KV cache stats (blocks, prefix hits).", kv_rows)
            meters: dict[str, tuple[str, list[tuple[dict[str, str], float]]]] = {}
            for r, s in sorted(gauges.items()):
                for name, doc, value in s.get("meter_gauges") or ():
                    meters.setdefault(name, (doc, []))[1].append(({"replica": r}, value))
            for name, (doc, rows) in meters.items():
                family(name, "gauge", doc, rows, prefix="modelcall:")
        return "".join(out).encode()
