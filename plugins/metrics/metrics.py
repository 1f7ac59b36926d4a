"""The metrics of one kernel: histograms and counters fed inline by bus observers, gauges read at scrape.

Observers only touch pre-bound prometheus children (a lock and a bucket search, about a
microsecond). Queue lengths, KV usage, prefix-cache counters and observer drops are read
from the kernel when /metrics is scraped, so they cost nothing per step.
"""
from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from modelcall.events import Finished, Preempted, RequestAdmitted, RequestRejected, TokensEmitted

P = "modelcall:"
LATENCY = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
           40.0, 80.0, 160.0, 640.0, 2560.0)
ITL = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
       10.0, 20.0, 40.0, 80.0)
REQUEST = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
REASONS = ("stop", "length", "abort", "tool_calls", "content_filter", "error")
KINDS = ("generate", "embed", "score")   # RequestAdmitted.kind


class KernelMetrics:
    """Everything `/metrics` shows for one kernel, in its own CollectorRegistry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r, m = self.registry, ["model_name"]
        self.h_ttft = Histogram(P + "time_to_first_token_seconds", "Time to first token (received to first token).",
                                m, buckets=LATENCY, registry=r)
        self.h_itl = Histogram(P + "inter_token_latency_seconds", "Time between consecutive output tokens.",
                               m, buckets=ITL, registry=r)
        self.h_e2e = Histogram(P + "e2e_request_latency_seconds", "Received to finished.", m, buckets=REQUEST,
                               registry=r)
        self.h_queue = Histogram(P + "request_queue_time_seconds", "Admitted to first scheduled.", m,
                                 buckets=REQUEST, registry=r)
        self.h_prefill = Histogram(P + "request_prefill_time_seconds", "First scheduled to first token.", m,
                                   buckets=REQUEST, registry=r)
        self.h_decode = Histogram(P + "request_decode_time_seconds", "First token to last token.", m,
                                  buckets=REQUEST, registry=r)
        self.c_prompt = Counter(P + "prompt_tokens", "Prompt tokens of finished requests.", m, registry=r)
        self.c_gen = Counter(P + "generation_tokens", "Generated tokens of finished requests.", m, registry=r)
        self.c_by_kind = Counter(P + "prompt_tokens_by_kind", "Prompt tokens of finished requests by kind: generate, "
                                 "or a pooling request's embed (embeddings) or score (rerank, score); they sum to "
                                 "prompt_tokens.", [*m, "kind"], registry=r)
        self.c_cached = Counter(P + "cached_prompt_tokens", "Prompt tokens read from the prefix cache.", m,
                                registry=r)
        # LoRA adapters (docs/lora.md): finished requests and their tokens by adapter (base-model requests not here)
        self.c_lora_requests = Counter(P + "lora_requests", "Finished requests that ran on a LoRA adapter, by adapter.",
                                       [*m, "lora"], registry=r)
        self.c_lora_prompt = Counter(P + "lora_prompt_tokens", "Prompt tokens of finished requests on a LoRA adapter.",
                                     [*m, "lora"], registry=r)
        self.c_lora_gen = Counter(P + "lora_generation_tokens", "Generated tokens of finished requests on a LoRA "
                                  "adapter.", [*m, "lora"], registry=r)
        self.c_cached_disk = Counter(P + "cached_prompt_tokens_disk", "Of cached_prompt_tokens, those read back "
                                     "from the disk KV tier.", m, registry=r)
        self.c_success = Counter(P + "request_success", "Finished requests by finish reason.",
                                 [*m, "finished_reason"], registry=r)
        self.c_preempt = Counter(P + "num_preemptions", "Requests preempted (recomputed later).", m, registry=r)
        self.c_rejected = Counter(P + "request_rejected", "Requests refused at admission, by HTTP status.",
                                  [*m, "status"], registry=r)
        self.c_refused = Counter(P + "entry_refused", "Requests refused by the entry pipeline, by the step that "
                                 "refused (auth: no valid key) and HTTP status.", [*m, "step", "status"], registry=r)
        self.kernel: Any = None
        self.model = ""
        self._last_token: dict[str, float] = {}
        self._pooling_kind: dict[str, str] = {}   # admitted pooling requests' kind; generation is the default
        self._lora: dict[str, str] = {}   # admitted requests on an adapter: its name (base-model requests: absent)

    def bind(self, model: str) -> None:
        """Pre-bind the label children of `model` (the observers then do no label lookups)."""
        self.model = model
        self.ttft, self.itl, self.e2e = (h.labels(model) for h in (self.h_ttft, self.h_itl, self.h_e2e))
        self.queue, self.prefill, self.decode = (h.labels(model) for h in (self.h_queue, self.h_prefill, self.h_decode))
        self.prompt, self.gen, self.cached = (c.labels(model) for c in (self.c_prompt, self.c_gen, self.c_cached))
        self.preempt = self.c_preempt.labels(model)
        self.cached_disk = self.c_cached_disk.labels(model)
        self.by_kind = {kind: self.c_by_kind.labels(model, kind) for kind in KINDS}
        self.success = {reason: self.c_success.labels(model, reason) for reason in REASONS}

    def attach(self, kernel: Any) -> None:
        self.kernel = kernel
        self.bind(kernel.model_name)
        self.registry.register(_KernelCollector(self))

    # ---- observers (inline: microseconds) -------------------------------------------------

    def on_tokens(self, ev: TokensEmitted) -> None:
        if not ev.token_ids:
            return
        last = self._last_token.get(ev.request_id)
        if last is not None:
            self.itl.observe(ev.ts - last)
        self._last_token[ev.request_id] = ev.ts

    def on_admitted(self, ev: RequestAdmitted) -> None:
        if ev.kind != "generate":   # NOTE: only pooling requests are kept, so generation pays no dict entry
            self._pooling_kind[ev.request_id] = ev.kind
        if ev.lora is not None:
            self._lora[ev.request_id] = ev.lora

    def on_finished(self, ev: Finished) -> None:
        self._last_token.pop(ev.request_id, None)
        kind = self._pooling_kind.pop(ev.request_id, "generate") if self._pooling_kind else "generate"
        child = self.by_kind.get(kind)
        if child is None:
            child = self.by_kind[kind] = self.c_by_kind.labels(self.model, kind)
        child.inc(ev.usage.prompt_tokens)
        t, u = ev.timings, ev.usage
        for hist, span in ((self.ttft, t.ttft_s), (self.e2e, t.e2e_s), (self.queue, t.queue_s),
                           (self.prefill, t.prefill_s), (self.decode, t.decode_s)):
            if span is not None:
                hist.observe(span)
        self.prompt.inc(u.prompt_tokens)
        self.gen.inc(u.completion_tokens)
        self.cached.inc(u.cached_tokens)
        if u.cached_disk_tokens:
            self.cached_disk.inc(u.cached_disk_tokens)
        child = self.success.get(ev.reason)
        if child is None:
            child = self.success[ev.reason] = self.c_success.labels(self.model, ev.reason)
        child.inc()
        lora = self._lora.pop(ev.request_id, None) if self._lora else None
        if lora is not None:
            self.c_lora_requests.labels(self.model, lora).inc()
            self.c_lora_prompt.labels(self.model, lora).inc(u.prompt_tokens)
            self.c_lora_gen.labels(self.model, lora).inc(u.completion_tokens)

    def on_failed(self, ev: Any) -> None:
        self._last_token.pop(ev.request_id, None)
        self._pooling_kind.pop(ev.request_id, None)
        self._lora.pop(ev.request_id, None)
        self.success["error"].inc()

    def on_preempted(self, ev: Preempted) -> None:
        self.preempt.inc()

    def on_rejected(self, ev: RequestRejected) -> None:
        status = str(ev.status)
        self.c_rejected.labels(self.model, status).inc()
        self.c_refused.labels(self.model, ev.step or "other", status).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _KernelCollector:
    """Read at scrape time: queues, KV usage, prefix cache counters, observer drops."""

    def __init__(self, metrics: KernelMetrics) -> None:
        self.m = metrics

    def describe(self) -> list:
        return []

    def collect(self) -> Any:
        kernel, model = self.m.kernel, [self.m.model]
        stats = kernel.stats() if kernel is not None else {}
        kv = stats.get("kv") or {}
        for name, doc, value in (("num_requests_running", "Requests in the running batch.", stats.get("running", 0)),
                                 ("num_requests_waiting", "Requests waiting to be scheduled.", stats.get("waiting", 0)),
                                 ("kv_cache_usage_perc", "Fraction of KV cache blocks in use (0-1).", kv.get("usage", 0.0))):
            g = GaugeMetricFamily(P + name, doc, labels=["model_name"])
            g.add_metric(model, float(value))
            yield g
        for _name, meter in getattr(kernel, "meters", None) or ():  # optional Meter.gauges (core/metering.py)
            for name, doc, value in (meter.gauges() if hasattr(meter, "gauges") else ()):
                g = GaugeMetricFamily(P + name, doc, labels=["model_name"])
                g.add_metric(model, float(value))
                yield g
        weights = getattr(getattr(kernel, "runner", None), "weight_bytes", None)   # optional (core ModelRunner)
        if weights is not None:
            g = GaugeMetricFamily(P + "model_weight_bytes", "Bytes of model weights held resident (quantized "
                                  "blocks as stored).", labels=["model_name"])
            g.add_metric(model, float(weights))
            yield g
        for name, doc, key in (("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", "queries"),
                               ("prefix_cache_hits", "Prompt tokens found in the prefix cache.", "hits")):
            c = CounterMetricFamily(P + name, doc, labels=["model_name"])
            c.add_metric(model, float(kv.get(key, 0)))
            yield c
        drops = CounterMetricFamily(P + "observer_dropped_events", "Events an offloaded observer (e.g. the ledger) "
                                    "dropped because its queue was full.", labels=["model_name", "observer"])
        errors = CounterMetricFamily(P + "observer_errors", "Events an observer failed on.",
                                     labels=["model_name", "observer"])
        bus = getattr(kernel, "bus", None)
        for label, counts in (bus.observer_stats() if bus is not None else {}).items():
            drops.add_metric([*model, label], float(counts["dropped"]))
            errors.add_metric([*model, label], float(counts["errors"]))
        for label, n in (stats.get("observer_errors") or {}).items():
            errors.add_metric([*model, f"{label}:inline"], float(n))
        yield drops
        yield errors
        yield from _kv_tier_families(kv, model)
        spec = getattr(kernel, "speculator", None)
        if spec is not None:   # vLLM's spec_decode counters, read from the speculator's totals
            for name, doc, value in (
                    ("spec_decode_num_drafts", "Drafts verified (speculative decoding).", spec.num_drafts),
                    ("spec_decode_num_draft_tokens", "Draft tokens verified.", spec.num_draft_tokens),
                    ("spec_decode_num_accepted_tokens", "Draft tokens accepted.", spec.num_accepted_tokens)):
                c = CounterMetricFamily(P + name, doc, labels=["model_name"])
                c.add_metric(model, float(value))
                yield c
            pos = CounterMetricFamily(P + "spec_decode_num_accepted_tokens_per_pos",
                                      "Draft tokens accepted, by position in the draft.", labels=["model_name", "position"])
            for j, n in enumerate(spec.accepted_by_position):
                pos.add_metric([*model, str(j)], float(n))
            yield pos


# The KV tiers' figures (plugins/kv_cache/tiers.py stats), present only when tiers are configured.
KV_TIER_COUNTERS = (
    ("kv_tier_host_hit_blocks", "KV blocks read back into the pool from host RAM.", "host_hit_blocks"),
    ("kv_tier_disk_hit_blocks", "KV blocks read back into the pool from the disk tier.", "disk_hit_blocks"),
    ("kv_tier_disk_written_blocks", "KV blocks written to the disk tier.", "disk_written"),
    ("kv_tier_disk_written_bytes", "Bytes written to the disk tier.", "disk_bytes_written"),
    ("kv_tier_disk_write_dropped_blocks", "KV blocks not written: the writer's queue was full.", "disk_write_dropped"),
    ("kv_tier_disk_rejected_blocks", "Disk blocks refused at read (checksum, header): deleted, never loaded.",
     "disk_rejected"),
    ("kv_tier_disk_evicted_blocks", "Disk blocks deleted to stay within kv_cache_disk_gb.", "disk_evicted"),
)
KV_TIER_GAUGES = (
    ("kv_tier_disk_bytes", "Bytes of block files in the disk tier (this model's fingerprint).", "disk_bytes"),
    ("kv_tier_disk_blocks", "KV blocks in the disk tier.", "disk_blocks"),
    ("kv_tier_disk_skipped_files", "Files found unusable at start-up (other fingerprint, corrupt, unfinished "
     "write): never loaded.", "disk_skipped_files"),
    ("kv_tier_host_blocks", "KV blocks held in the host-RAM tier.", "host_blocks"),
)


def _kv_tier_families(kv: dict, model: list[str]) -> Any:
    for families, kind in ((KV_TIER_COUNTERS, CounterMetricFamily), (KV_TIER_GAUGES, GaugeMetricFamily)):
        for name, doc, key in families:
            if key in kv:
                f = kind(P + name, doc, labels=["model_name"])
                f.add_metric(model, float(kv[key]))
                yield f
