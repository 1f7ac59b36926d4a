"""modelcall-usage-csv: a meter that appends one CSV row of usage and timings per request.

    plugin_config = {"usage_csv": {"path": "usage.csv"}}      # or MODELCALL_USAGE_CSV=usage.csv

Columns: request_id, task_id, caller, model, outcome (finish reason, `rejected` or `failed`),
prompt_tokens, cached_tokens, completion_tokens, reasoning_tokens, queue_s, ttft_s, e2e_s.
Each token figure is by its own definition (cached is part of prompt, reasoning part of
completion); nothing is summed. Rows are written by a worker thread: the engine only enqueues.
"""
from __future__ import annotations

import csv
import os
from typing import Any

from modelcall.core import hookimpl
from modelcall.events import Finished, OffloadedObserver, RequestFailed, RequestRejected

__version__ = "0.1.0"

COLUMNS = ("request_id", "task_id", "caller", "model", "outcome", "prompt_tokens", "cached_tokens",
           "completion_tokens", "reasoning_tokens", "queue_s", "ttft_s", "e2e_s")


@hookimpl
def register_meters(register: Any, config: Any) -> None:
    path = config.plugin_config.get("usage_csv", {}).get("path") or os.environ.get("MODELCALL_USAGE_CSV")
    if path:
        register(UsageCSV(path))


@hookimpl
def shutdown(kernel: Any) -> None:
    for _plugin, meter in kernel.meters:
        if isinstance(meter, UsageCSV):
            meter.close()


class UsageCSV:
    """A `modelcall.core.metering.Meter`. Also a plugin object: `Kernel(plugins=[UsageCSV(path)])`."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        new = not os.path.exists(self.path) or os.path.getsize(self.path) == 0
        self._file = open(self.path, "a", newline="", encoding="utf-8")  # noqa: SIM115 - closed at shutdown
        self._writer = csv.writer(self._file)
        if new:
            self._writer.writerow(COLUMNS)
        self._admitted: dict[str, tuple[str, str]] = {}  # request id -> (caller, model), from reserve()
        self._worker = OffloadedObserver(self._write, name="usage-csv")

    @hookimpl
    def register_meters(self, register: Any) -> None:
        register(self)

    @hookimpl
    def shutdown(self) -> None:
        self.close()

    # ---- the Meter protocol (inline in the engine: bookkeeping only) ------------------------

    def reserve(self, admission: Any) -> None:
        """Admission: remember who asked for which model (this meter never refuses)."""
        caller = admission.caller.name if admission.caller is not None else ""
        self._admitted[admission.request_id] = (caller, admission.model)

    def observe(self, event: Any) -> None:
        caller, model = self._admitted.pop(event.request_id, ("", ""))
        self._worker((event, caller, model))

    # ---- the worker thread ------------------------------------------------------------------

    def _write(self, item: tuple[Any, str, str]) -> None:
        ev, caller, model = item
        row: dict[str, Any] = {"request_id": ev.request_id, "task_id": ev.task_id or "", "caller": caller,
                               "model": model}
        if isinstance(ev, Finished):
            u, t = ev.usage, ev.timings
            row.update(outcome=ev.reason, prompt_tokens=u.prompt_tokens, cached_tokens=u.cached_tokens,
                       completion_tokens=u.completion_tokens, reasoning_tokens=u.reasoning_tokens,
                       queue_s=_s(t.queue_s), ttft_s=_s(t.ttft_s), e2e_s=_s(t.e2e_s))
        elif isinstance(ev, RequestRejected):
            row.update(outcome="rejected")
        elif isinstance(ev, RequestFailed):
            row.update(outcome="failed")
        else:
            return
        self._writer.writerow([row.get(c, "") for c in COLUMNS])
        self._file.flush()

    def flush(self) -> None:
        """Wait until every row so far is on disk."""
        self._worker.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._worker.flush()
            self._worker.close()
            self._file.close()


def _s(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds:.6f}"
