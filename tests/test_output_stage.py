"""The core output stage: stop strings release held text in order on every ending (a property over
any token stream and stop list), and output filters act on everything that leaves: content,
reasoning, tool arguments, logprobs and top_logprobs."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modelcall.core import Request, SamplingParams
from modelcall.core.output import OutputState
from modelcall.core.safety import LogprobGate, OutputFilters, output_chain
from modelcall.events import Finished, PositionLogprobs, TokenLogprob, TokensEmitted
from modelcall.plugins.safety.blocklist import Blocklist
from modelcall.plugins.safety.pii import PiiRedactor
from modelcall.testing import ScriptedSampler

EOS = 0


class PieceDetok:
    """A detokenizer whose token i is the text pieces[i] (any text, any chunking)."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def push(self, token_ids) -> str:  # noqa: ANN001
        return "".join(self.pieces[t] for t in token_ids)

    def flush(self) -> str:
        return ""


def run_stream(pieces: list[str], stops: tuple[str, ...], ending: str, blocked: str = "") -> tuple[str, str]:
    """Feed tokens 1..n (token i says pieces[i]) through an OutputState; end as `ending` says.
    `blocked`: a blocklist term the output filters end the request on."""
    n = len(pieces) - 1
    params = SamplingParams.create(stop=stops or None, max_tokens=n + 1)
    req = Request("r", [5], params, max_tokens=n if ending == "length" else n + 1, eos_token_ids=frozenset({EOS}))
    filters = OutputFilters(lambda: output_chain([("bl", Blocklist([blocked]))], req)) if blocked else None
    out = OutputState(PieceDetok(pieces), params.stop, False, filters=filters)
    text, reason = [], None
    for t in range(1, n + 1):
        req.all_token_ids.append(t)
        r = out.on_token(req, t, window=10_000)
        text.append(r.text)
        if r.reason is not None:
            return "".join(text), r.reason
    if ending == "eos":
        req.all_token_ids.append(EOS)
        r = out.on_token(req, EOS, window=10_000)
    else:
        r = out.close("abort")
    text.append(r.text)
    return "".join(text), r.reason


def cut_at_first_stop(text: str, stops: tuple[str, ...]) -> str:
    """The reference: the unstopped text cut where the first stop string to complete begins."""
    found = [(text.find(s) + len(s), -len(s), s) for s in stops if s and s in text]
    if not found:
        return text
    end, _, s = min(found)
    return text[:end - len(s)]


alphabet = st.sampled_from(["a", "b", "Q", "\n", "é", "]", "�"])
pieces_st = st.lists(st.text(alphabet, max_size=4), min_size=1, max_size=12)
stops_st = st.lists(st.text(alphabet, min_size=1, max_size=4), max_size=3).map(tuple)


@settings(max_examples=400, deadline=None)
@given(pieces_st, stops_st, st.sampled_from(["length", "eos", "abort"]))
def test_stopped_output_is_the_unstopped_output_cut_at_the_first_complete_stop(pieces, stops, ending):
    pieces = ["<unused>", *pieces]
    text, reason = run_stream(pieces, stops, ending)
    whole = "".join(pieces[1:])
    assert text == cut_at_first_stop(whole, stops)
    stopped = any(s in whole for s in stops)
    assert reason == ("stop" if stopped or ending == "eos" else ending)


@settings(max_examples=300, deadline=None)
@given(pieces_st, stops_st, st.sampled_from(["length", "eos", "abort"]), st.text(alphabet, min_size=1, max_size=3))
def test_with_a_filter_the_output_is_the_stopped_output_cut_at_the_blocked_term(pieces, stops, ending, term):
    pieces = ["<unused>", *pieces]
    text, reason = run_stream(pieces, stops, ending, blocked=term)
    stopped = cut_at_first_stop("".join(pieces[1:]), stops)
    i = stopped.lower().find(term.lower())
    assert text == (stopped if i < 0 else stopped[:i])
    if i >= 0:
        assert reason == "content_filter"


def test_held_stop_prefix_is_released_in_order_when_the_request_ends_on_length():
    # The case: text that starts "\nQQQ" but never completes it, then max_tokens.
    pieces = ["<unused>", "viron", " work", "�", "]", "\n"]
    for ending in ("length", "eos", "abort"):
        assert run_stream(pieces, ("\nQQQ",), ending)[0] == "viron work�]\n"


@pytest.mark.anyio
async def test_the_kernel_releases_held_stop_text_in_order_on_length(make_kernel):
    sampler = ScriptedSampler()
    async with make_kernel(plugins=[sampler]) as kernel:
        said = "viron work]\n"
        ids = kernel.tokenizer.encode(said)
        sampler.say(ids + ids)
        done = await kernel.complete("hi", max_tokens=len(ids), stop=["\nQQQ"])
        assert (done.text, done.finish_reason) == (said, "length")
        done = await kernel.complete("hi", max_tokens=2 * len(ids), stop=["work]"])
        assert (done.text, done.finish_reason, done.finished.stop_reason) == ("viron ", "stop", "work]")


# ---- filters on everything that leaves ----------------------------------------------------------

def _pos(token_id: int, *alts: int) -> PositionLogprobs:
    return PositionLogprobs(token_id, -0.5, tuple(TokenLogprob(a, -1.0) for a in (token_id, *alts)))


def test_logprob_positions_of_redacted_or_blocked_text_are_withheld():
    texts = {1: "mail ", 2: "jane", 3: "@example.org", 4: " now", 5: " ok", 6: "launch", 7: " code", 8: "x@y.io"}
    redact = [("pii", PiiRedactor())]
    gate = LogprobGate(lambda: output_chain(redact, None), texts.__getitem__)
    released = []
    for t in (1, 2, 3, 4, 5):
        released += gate.push(texts[t], _pos(t, 8), final=t == 5)
    ids = [p.token_id for p in released]
    assert 2 not in ids and 3 not in ids and ids[0] == 1 and 5 in ids
    # an alternative that is itself an address never leaves through top_logprobs
    assert all(a.token_id != 8 for p in released for a in p.top)
    block = [("bl", Blocklist(["launch code"]))]
    gate = LogprobGate(lambda: output_chain(block, None), texts.__getitem__)
    released = []
    for t in (1, 6, 7, 4):
        released += gate.push(texts[t], _pos(t), final=t == 4)
    assert [p.token_id for p in released] == [1]


def test_tool_arguments_and_reasoning_pass_the_filters():
    from modelcall.core.tools import ToolCall
    from modelcall.events import ToolCallDelta

    f = OutputFilters(lambda: output_chain([("pii", PiiRedactor())], None))
    deltas = (ToolCallDelta(0, "c0", "send"), ToolCallDelta(0, arguments='{"to": "jane.roe@exa'),
              ToolCallDelta(0, arguments='mple.org"}'))
    out, calls = f.calls(deltas, (ToolCall("c0", "send", '{"to": "jane.roe@example.org"}'),), final=False)
    assert "".join(d.arguments for d in out) == '{"to": "[email]"}'
    assert [(c.id, json.loads(c.arguments)) for c in calls] == [("c0", {"to": "[email]"})]
    c, r = f.text("answer", "think of jane.roe@example.org", final=True)
    assert (c, r) == ("answer", "think of [email]")


@pytest.mark.anyio
async def test_a_filtered_request_with_logprobs_leaks_nothing_anywhere(make_kernel):
    """Real model, real sampler (logprobs with top alternatives), a forcing logits processor."""
    cfg = {"safety": {"blocklist": ["launch code"], "redact_pii": True}}
    async with make_kernel(plugin_config=cfg) as kernel:
        tok = kernel.tokenizer
        eos = min(tok.eos_token_ids)

        def forcing(ids):
            def fn(out, row):  # noqa: ANN001, ANN202
                row.fill_(float("-inf"))
                row[ids[len(out)] if len(out) < len(ids) else eos] = 0.0
            return fn

        async def run(text: str, **kw):
            ids = tok.encode(text)
            evs = []
            async for ev in kernel.generate("hi", max_tokens=len(ids) + 2, logprobs=3, temperature=0,
                                            logits_processors=[forcing(ids)], **kw):
                evs.append(ev)
            return evs

        def leaked(evs, words):
            shown = []
            for ev in evs:
                if isinstance(ev, TokensEmitted):
                    shown += [ev.text, ev.reasoning]
                    for p in ev.logprobs or ():
                        shown += [tok.decode([p.token_id])] + [tok.decode([a.token_id]) for a in p.top]
            joined = "".join(shown).lower()
            return [w for w in words if w in joined]

        evs = await run("Write to jane.roe@example.org today.")
        fin = evs[-1]
        assert isinstance(fin, Finished) and fin.text == "Write to [email] today."
        assert not leaked(evs, ["jane", "example.org"])
        released = [p for ev in evs if isinstance(ev, TokensEmitted) for p in ev.logprobs or ()]
        assert released and tok.decode([released[0].token_id]) == tok.decode(tok.encode("Write to")[:1])
        evs = await run("Sure, the launch code is 0000.")
        assert evs[-1].reason == "content_filter"
        assert not leaked(evs, ["launch"])


@pytest.mark.anyio
@pytest.mark.parametrize("blocklist", [None, ["launch code"]], ids=["no filters", "a blocklist"])
async def test_without_filters_a_request_has_no_filter_stage(make_kernel, monkeypatch, blocklist):
    """The output state the kernel opens for a plain prompt: no filter stage unless a filter is configured
    (the blocklist case shows the capture sees the stage when there is one)."""
    cfg = {"safety": {"blocklist": blocklist}} if blocklist else {}
    async with make_kernel(plugin_config=cfg) as kernel:
        opened: list[OutputState] = []
        stage_open = kernel.output_stage.open

        def capture(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            opened.append(stage_open(*args, **kwargs))
            return opened[-1]

        monkeypatch.setattr(kernel.output_stage, "open", capture)
        h = await kernel.submit("hi", max_tokens=2)
        await h.result()
        [state] = opened
        assert state.reasoning is None  # a plain prompt is never split into reasoning
        assert (state.filters is not None) == bool(blocklist)
        assert state.plain == (not blocklist)



# ---- logprob bytes -------------------------------------------------------------------------------

def test_logprob_bytes_are_each_tokens_own_bytes(demo_model_dir):
    from types import SimpleNamespace

    from modelcall.plugins.http.openai_common import chat_logprobs
    from modelcall.plugins.http.service import ServingContext
    from modelcall.plugins.http.settings import ServerSettings
    from modelcall.plugins.tokenizer_hf import HFTokenizer

    tok = HFTokenizer(demo_model_dir)
    text = "中文 ok, 你好!"
    ids = tok.encode(text)
    ctx = ServingContext(SimpleNamespace(tokenizer=tok), ServerSettings(port=0))
    rendered = chat_logprobs(ctx, [PositionLogprobs(i, -0.1, (TokenLogprob(i, -0.1),)) for i in ids]).content
    assert b"".join(bytes(c.bytes) for c in rendered) == text.encode()
    assert [c.top_logprobs[0].bytes for c in rendered] == [c.bytes for c in rendered]
    halves = [bytes(c.bytes) for c in rendered if c.token == "\ufffd"]
    assert halves, "the demo tokenizer splits these characters into byte tokens"
    for b in halves:  # a token that is part of a character has those bytes, not U+FFFD's
        assert b != "\ufffd".encode()


# ---- reasoning in the kernel (embedded apps see the same split as the front ends) --------------

@pytest.mark.anyio
async def test_chat_output_is_split_in_the_kernel_and_enable_thinking_false_turns_it_off(make_kernel):
    sampler = ScriptedSampler()
    async with make_kernel(plugins=[sampler]) as kernel:
        tok = kernel.tokenizer
        script = tok.encode("<think>\nweigh it\n</think>\n\nYes.")
        sampler.say(script)
        msgs = [{"role": "user", "content": "ok?"}]
        done = await kernel.complete(messages=msgs, max_tokens=32)
        assert (done.reasoning, done.text) == ("weigh it\n", "Yes.")
        assert done.usage.reasoning_tokens == script.index(tok.token_to_id("</think>")) + 1
        off = await kernel.complete(messages=msgs, max_tokens=32, chat_template_kwargs={"enable_thinking": False})
        assert (off.reasoning, off.usage.reasoning_tokens) == ("", 0) and off.text.startswith("<think>")
        raw = await kernel.complete("ok?", max_tokens=32)  # a plain prompt's output stays raw text
        assert raw.text == tok.decode(script) and raw.usage.reasoning_tokens == 0


# ---- the whole pipeline does not depend on how the output was tokenized --------------------------

SEGMENTS = ["Hi. ", "<think>\nplan ", '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>', "</think>",
            "\n\nSo: ", '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>', " done", "<think>"]


def run_pipeline(pieces: list[str]) -> tuple[str, str, list[tuple[str, str]], str]:
    from modelcall.core.tools import ToolCallStream
    from modelcall.plugins.reasoning.think import ThinkParser
    from modelcall.plugins.tool_parsers.hermes import HermesParser

    pieces = ["<unused>", *pieces]
    params = SamplingParams.create(max_tokens=len(pieces))
    req = Request("r", [5], params, max_tokens=len(pieces) - 1)
    out = OutputState(PieceDetok(pieces), reasoning=ThinkParser(), tools=ToolCallStream(HermesParser(), "r", None))
    calls, reason = [], None
    for t in range(1, len(pieces)):
        req.all_token_ids.append(t)
        r = out.on_token(req, t, window=10_000)
        calls += [(c.name, c.arguments) for c in r.calls]
        reason = r.reason or reason
    return out.text, out.reasoning_text, calls, reason


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=6), st.lists(st.integers(0, 400), max_size=10))
def test_content_reasoning_and_calls_are_the_same_however_the_output_is_chunked(segments, cuts):
    text = "".join(segments)
    cuts = sorted({c % (len(text) + 1) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    content, reasoning, calls, reason = run_pipeline(pieces)
    assert (content, reasoning, calls) == run_pipeline([text])[:3]
    assert reason == "length"  # ended by max_tokens: complete calls or not, the finish says length
    inside = False  # a call written inside reasoning is never a call
    expected = []
    for s in segments:
        if s.startswith("<think>"):
            inside = True
        elif s == "</think>":
            inside = False
        elif s.startswith("<tool_call>") and not inside:
            expected.append(json.loads(s[len("<tool_call>"):-len("</tool_call>")])["name"])
    assert [n for n, _ in calls] == expected
    assert "<tool_call>" not in content and "<think>" not in content
