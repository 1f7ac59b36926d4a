"""Safety filters: input checks refuse with 400 and the reason; streaming output filters hold back only
what a pattern needs, redact PII, and end a blocked output with content_filter (OpenAI) / refusal (Anthropic)."""
from __future__ import annotations

import httpx2 as httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from http_server import ServerThread

from modelcall.core import InvalidRequest
from modelcall.core.errors import ContentBlocked
from modelcall.core.safety import FilterChain
from modelcall.events import RequestRejected, TokensEmitted
from modelcall.plugins.safety.blocklist import Blocklist
from modelcall.plugins.safety.pii import PiiRedactor, PiiStream, luhn_ok, redact
from modelcall.testing import ScriptedSampler

SAID = "Contact me at jane.roe@example.org or (555) 123-4567; card 4111 1111 1111 1111. Bye"
REDACTED = "Contact me at [email] or [phone]; card [card]. Bye"


def _stream(f, pieces: list[str]) -> tuple[str, str | None]:
    out = "".join(f.push(p) for p in pieces)
    if f.blocked is None:
        out += f.flush()
    return out, f.blocked


def _split(text: str, cuts: list[int]) -> list[str]:
    cuts = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 200), max_size=12))
def test_pii_redaction_is_the_same_however_the_output_is_chunked(cuts):
    out, blocked = _stream(PiiStream(128), _split(SAID, cuts))
    assert out == redact(SAID) == REDACTED and blocked is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 200), max_size=12), st.sampled_from(["forbidden", "Forbidden Fruit", "x"]))
def test_a_blocked_term_never_leaks_however_the_output_is_chunked(cuts, term):
    text = "all good so far, then FORBIDDEN fruit appears and more text"
    f = Blocklist([term]).output_filter(None)
    out, blocked = _stream(f, _split(text, cuts))
    i = text.lower().find(term.lower())
    assert blocked and out == text[:i]


def test_the_blocklist_holds_back_only_what_the_longest_pattern_needs():
    f = Blocklist(["secret"]).output_filter(None)
    assert f.push("hello wor") == "hello wor"   # nothing here can become "secret"
    assert f.push("ld and sEc") == "ld and "    # "sEc" still could
    assert f.push("ond") == "sEcond"
    assert f.push(" s") == " " and f.push("ecret") == "" and f.blocked
    r = Blocklist([], [r"\bkey-\d{4}\b"], max_match=9).output_filter(None)
    assert r.push("some text here") == "some t"   # a regex holds back max_match - 1 characters
    p = PiiStream(128)
    assert p.push("The answer is ") == "The answer is "   # prose is released at once
    assert p.push("call 555") == "call "                  # digits that may become a phone number wait


def test_card_numbers_need_a_valid_luhn_checksum():
    assert luhn_ok("4111111111111111") and not luhn_ok("4111111111111112")
    assert redact("id 1234 5678 9012 3456 ok") == "id 1234 5678 9012 3456 ok"
    assert redact("visa 4111-1111-1111-1111.") == "visa [card]."


def test_input_checks_give_a_reason():
    b = Blocklist(["rm -rf"])
    assert b.check_input("please RM -RF /").blocked
    assert b.check_input("harmless") is None
    assert PiiRedactor().check_input("mail a@b.co") is None
    assert PiiRedactor(block_input=True).check_input("mail a@b.co").blocked


def test_a_chain_feeds_each_filter_what_the_one_before_released():
    chain = FilterChain([PiiStream(128), Blocklist(["[card]"]).output_filter(None)])
    out = chain.push("pay with 4111 1111 1111 1111 now", final=True)
    assert chain.blocked and out == "pay with "


# ---- in a kernel ---------------------------------------------------------------------------

@pytest.mark.anyio
async def test_a_blocked_output_ends_with_content_filter_and_pii_is_redacted_in_the_kernel(make_kernel, events):
    sampler = ScriptedSampler()
    cfg = {"safety": {"blocklist": ["launch code"], "redact_pii": True}}
    async with make_kernel(plugins=[sampler], plugin_config=cfg) as kernel:
        sampler.say(kernel.tokenizer.encode(SAID))
        done = await kernel.complete("hi", max_tokens=64)
        assert done.finish_reason == "stop" and done.text == REDACTED
        assert done.finished.text == REDACTED
        sampler.say(kernel.tokenizer.encode("Sure, the Launch Code is 0000."))
        events.clear()
        done = await kernel.complete("hi", max_tokens=64)
        assert done.finish_reason == "content_filter" and done.text == "Sure, the "
        assert "aunch" not in "".join(e.text for e in events.of(TokensEmitted))
        with pytest.raises(ContentBlocked, match="blocklist") as e:
            await kernel.complete(messages=[{"role": "user", "content": "what is the launch code?"}], max_tokens=4)
        assert isinstance(e.value, InvalidRequest) and e.value.status == 400
    assert events.of(RequestRejected)[-1].status == 400


@pytest.mark.anyio
async def test_without_filters_the_output_path_is_untouched(make_kernel, events):
    from modelcall.core.output import OutputState

    sampler = ScriptedSampler()
    async with make_kernel(plugins=[sampler]) as kernel:
        assert kernel._output_filters == []
        added = []
        add = kernel.engine.add

        def spy(record):  # every admitted request's record, seen as it enters the engine
            added.append(record)
            add(record)
        kernel.engine.add = spy
        ids = kernel.tokenizer.encode(SAID)
        sampler.say(ids)
        done = await kernel.complete("hi", max_tokens=len(ids) + 1)
        pieces = [kernel.tokenizer.decode([t]) for t in ids]
    assert len(added) == 1
    out = added[0].output
    assert type(out) is OutputState and getattr(out, "filters", None) is None  # no filter stage at all
    assert done.text == SAID  # the PII is left as said: no filter was configured
    # nothing held back: each token's text is released in the step that sampled it
    released = [e.text for e in events.of(TokensEmitted) if e.request_id == done.request_id]
    assert released[:len(ids)] == pieces and "".join(released[len(ids):]) == ""  # then the end-of-sequence token


# ---- over HTTP: each protocol's words -------------------------------------------------------

@pytest.fixture(scope="module")
def server():
    sampler = ScriptedSampler()
    with ServerThread(plugins=(sampler,), plugin_config={"safety": {"blocklist": ["launch code"]}}) as s:
        s.sampler = sampler
        yield s


def test_http_blocked_output_is_content_filter_for_openai_and_refusal_for_anthropic(server):
    base = server.base_url
    server.call(lambda: server.sampler.say(server.kernel.tokenizer.encode("The launch code is 1234.")))
    model = httpx.get(base + "/v1/models").json()["data"][0]["id"]
    msgs = [{"role": "user", "content": "tell me"}]
    b = httpx.post(base + "/v1/chat/completions", json={"model": model, "messages": msgs, "max_tokens": 32}).json()
    assert b["choices"][0]["finish_reason"] == "content_filter"
    assert "launch" not in (b["choices"][0]["message"]["content"] or "").lower()
    b = httpx.post(base + "/v1/messages", json={"model": model, "messages": msgs, "max_tokens": 32}).json()
    assert b["stop_reason"] == "refusal"
    r = httpx.post(base + "/v1/chat/completions", json={"model": model, "max_tokens": 4,
                                                         "messages": [{"role": "user", "content": "the LAUNCH CODE?"}]})
    assert r.status_code == 400 and "blocklist" in r.json()["error"]["message"]
    r = httpx.post(base + "/v1/messages", json={"model": model, "max_tokens": 4,
                                                 "messages": [{"role": "user", "content": "the launch code?"}]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
