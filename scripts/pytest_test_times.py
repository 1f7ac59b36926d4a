"""A pytest plugin for scripts/test_time_ab.py: wall and CPU seconds of each test, written as JSON.

Loaded with `-p pytest_test_times` (scripts/ on PYTHONPATH); writes to $TEST_TIMES_JSON at the end.
CPU = user+sys of the pytest process (its threads: in-process servers run on threads) plus that of the
children it has waited for (a test's subprocesses). A test's time includes its setup and teardown, so a
module-scoped fixture counts in the first test that uses it and its teardown in the file's last test.
"""
from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Generator

import pytest

_times: dict[str, tuple[float, float]] = {}


def cpu_seconds() -> float:
    """user+sys of this process and of its reaped children."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    wall, cpu = time.perf_counter(), cpu_seconds()
    yield
    _times[item.nodeid] = (time.perf_counter() - wall, cpu_seconds() - cpu)


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("TEST_TIMES_JSON")
    if path:
        with open(path, "w") as f:
            json.dump({k: {"wall_s": w, "cpu_s": c} for k, (w, c) in _times.items()}, f, indent=1)
