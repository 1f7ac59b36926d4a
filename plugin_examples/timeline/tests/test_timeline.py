"""The timeline draws one line per finished request, with its phases as a bar and its usage."""
import io
import re

import pytest

import modelcall_timeline

pytestmark = pytest.mark.anyio


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


async def test_one_line_per_request_with_queue_prefill_decode_and_usage(make_kernel):
    out = io.StringIO()
    timeline = modelcall_timeline.Timeline(out, width=30)
    async with make_kernel(plugins=[timeline]) as kernel:
        a = await kernel.complete("def add(a, b):", request_id="req-a", max_tokens=8, ignore_eos=True)
        b = await kernel.complete("import sys", request_id="req-b", max_tokens=3, ignore_eos=True)
    timeline.flush()
    lines = out.getvalue().splitlines()
    assert [line.split()[0] for line in lines] == ["req-a", "req-b"]
    for line, done in zip(lines, (a, b)):
        bar = re.search(r"\|(.*)\|", line).group(1)
        assert len(bar) == 30 and re.fullmatch(r"q*P+=*", bar.rstrip()), bar
        assert f"prompt {done.usage.prompt_tokens} " in line
        assert f"→ {done.usage.completion_tokens} tok" in line and done.finish_reason in line
    assert "\x1b[" not in out.getvalue()  # not a terminal: no redrawing


async def test_on_a_terminal_requests_in_flight_are_redrawn_in_place(make_kernel):
    out = FakeTTY()
    timeline = modelcall_timeline.Timeline(out, interval_s=0.0)
    async with make_kernel(plugins=[timeline]) as kernel:
        await kernel.complete("hello", request_id="req-live", max_tokens=6, ignore_eos=True)
    timeline.flush()
    text = out.getvalue()
    assert "running" in text and "\x1b[1F\x1b[J" in text  # drawn live, then replaced
    last = re.sub(r"\x1b\[\d*[A-Za-z]", "", text).rstrip("\n").splitlines()[-1]
    assert last.startswith("req-live") and "length" in last


async def test_installed_it_stays_quiet_until_enabled(make_kernel, capsys):
    async with make_kernel(plugins=[modelcall_timeline]) as kernel:
        await kernel.complete("quiet", max_tokens=2)
        assert "timeline" not in kernel.bus.observer_errors
    assert not re.search(r"\|[qP=]+ *\|", capsys.readouterr().err)


def test_the_bar_scales_phases_to_the_width():
    timeline = modelcall_timeline.Timeline(io.StringIO(), width=10)
    assert timeline._bar(0.0, 2.0, 4.0, 10.0) == "qqPP======"
    assert timeline._bar(0.0, 0.0, 0.001, 10.0) == "P========="  # no queue; a short prefill still shows
