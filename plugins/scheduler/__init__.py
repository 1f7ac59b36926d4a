"""The built-in scheduler: continuous batching of computed-catching-up-with-known tokens, chunked prefill,
FCFS or priority admission, and preemption by recompute."""
from modelcall.plugins.scheduler.scheduler import DefaultScheduler

__all__ = ["DefaultScheduler"]
