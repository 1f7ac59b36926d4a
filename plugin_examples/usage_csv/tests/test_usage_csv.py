"""The CSV meter writes one row per request whose figures match the request's own usage."""
import csv

import pytest

import modelcall_usage_csv
from modelcall.core import ContextOverflow
from modelcall.core.metering import Caller

pytestmark = pytest.mark.anyio


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


async def test_one_row_per_request_with_the_usage_the_client_saw(make_kernel, tmp_path):
    path = tmp_path / "usage.csv"
    meter = modelcall_usage_csv.UsageCSV(path)
    async with make_kernel(plugins=[meter]) as kernel:
        a = await kernel.complete("def f(x):", request_id="r-a", task_id="t-1", max_tokens=5, ignore_eos=True)
        b = await kernel.complete("def f(x):", request_id="r-b", max_tokens=3, ignore_eos=True,
                                  caller=Caller(name="team-blue"))
        with pytest.raises(ContextOverflow):
            await kernel.complete("too long", request_id="r-c", max_tokens=kernel.window)
    rows = {r["request_id"]: r for r in read(path)}  # the kernel stopped: the meter closed and flushed
    assert list(rows) == ["r-a", "r-b", "r-c"]
    for done in (a, b):
        row, u = rows[done.request_id], done.usage
        assert row["outcome"] == done.finish_reason == "length"
        assert (int(row["prompt_tokens"]), int(row["cached_tokens"]), int(row["completion_tokens"])) == \
            (u.prompt_tokens, u.cached_tokens, u.completion_tokens)
        assert float(row["e2e_s"]) >= float(row["ttft_s"]) > 0
    assert rows["r-a"]["task_id"] == "t-1" and rows["r-b"]["caller"] == "team-blue"
    assert rows["r-b"]["model"] == kernel.model_name
    assert rows["r-c"]["outcome"] == "rejected" and rows["r-c"]["completion_tokens"] == ""


async def test_installed_it_writes_to_the_configured_path_and_appends_across_restarts(make_kernel, tmp_path):
    path = tmp_path / "usage.csv"
    for _ in range(2):
        async with make_kernel(plugins=[modelcall_usage_csv],
                               plugin_config={"usage_csv": {"path": str(path)}}) as kernel:
            await kernel.complete("hello", max_tokens=2, ignore_eos=True)
    rows = read(path)
    assert len(rows) == 2 and all(r["completion_tokens"] == "2" for r in rows)
    assert open(path).read().count("request_id") == 1  # one header


async def test_not_configured_it_registers_no_meter(make_kernel):
    async with make_kernel(plugins=[modelcall_usage_csv]) as kernel:
        assert not any(isinstance(m, modelcall_usage_csv.UsageCSV) for _, m in kernel.meters)
