"""The engine loop's `apply`: a forward's output joins its requests (core/engine.py's loop runs it after each
forward, in the event loop's thread).

Each chunk's computed tokens are counted and their K/V blocks committed; a sampled token is appended and goes
through its request's output stage (detokenize, stops, parsers, filters: `TokensEmitted`, tool calls, the stage's
end); a verified draft goes through token by token; a pooling prompt's rows are kept and, at its end, pooled
(`Pooled`); a request that ends is finished here (`Finished`, its blocks released once the forward that may read
them is done) or failed (`RequestFailed`). Every event is appended to the step's list: the loop publishes them.
"""
from __future__ import annotations

import logging
from typing import Any

from modelcall.core.forward import ForwardWorker
from modelcall.core.output import Released
from modelcall.core.plan import SchedulePlan, StepOutput
from modelcall.core.pooling import Pooler
from modelcall.core.record import RequestRecord
from modelcall.core.request import Request, Status
from modelcall.core.stages import KVCachePolicy, Scheduler
from modelcall.events import Pooled, PrefillDone, PromptLogprobs, RequestFailed, TokensEmitted

log = logging.getLogger("modelcall.engine")


PendingToken = tuple[RequestRecord, int, Any]  # (record, token, its logprobs): its output stage still to run


class StepApplier:
    """The engine's apply half, a base of `Engine`: what a step's output does to its requests and which events say
    so. The loop (Engine) owns the state these methods read and update."""

    records: dict[str, RequestRecord]   # the live requests by id
    scheduler: Scheduler
    kv: KVCachePolicy
    forwards: ForwardWorker            # frees a finished request's blocks once the running forward is done
    window: int                        # the model's context window
    speculator: Any                    # core/speculative.py's, or None
    pooler: Pooler | None
    _overlap: bool                     # async scheduling: a token's output stage may wait for the next forward

    def _apply(self, plan: SchedulePlan, output: StepOutput, t: float, events: list) -> list[PendingToken]:
        """Computed counts, K/V commits and the sampled tokens appended, each through its output stage;
        with async scheduling only the forward-critical half: returns the tokens whose output stage
        waits for `_publish` (a token at its request's limit goes through at once, so a request is
        never scheduled past its limit)."""
        logprobs = output.logprobs
        spec = output.spec_tokens
        todo: list[PendingToken] = []
        for i, chunk in enumerate(plan.chunks):
            req = chunk.request
            if req.status is Status.FINISHED:  # ended while this forward ran (async scheduling): row dropped
                continue
            if spec is not None and spec[i] is not None:
                # NOTE: a verified draft goes through the output stage now, token by token (a stop may
                # end it mid-draft), so the next schedule proposes from the request's final tokens.
                self._apply_draft(chunk, spec[i], t, events)
                continue
            self._computed(chunk, output, i, t, events)
            token = output.token_ids[i]
            rec = self.records[req.request_id]
            if token is None:
                # NOTE: only chunks that sampled nothing come here, so generation pays no pooling check
                if req.pooling is not None:
                    self._pool(rec, chunk, output, i, t, events)
                elif req.max_tokens == 0 and req.num_computed_tokens >= req.num_prompt_tokens:
                    self._finish(rec, rec.output.close("length"), t, events)  # scored, nothing to generate
                continue
            self._append(rec, token, t, events)
            lp = logprobs[i] if logprobs is not None else None
            if self._overlap and req.num_output_tokens < req.max_tokens and req.num_tokens < self.window:
                todo.append((rec, token, lp))
            else:
                self._emit(rec, token, lp, t, events)
        return todo

    def _apply_burst(self, plan: SchedulePlan, output: StepOutput, events: list) -> None:
        """A decode burst's steps, in order, as single steps would apply them (core/burst.py): each token computed,
        appended and through its output stage at its own step's time; a request ended keeps none of its later ones."""
        assert output.burst is not None and output.burst_ts is not None
        for tokens, t in zip(output.burst, output.burst_ts):
            for i, (chunk, token) in enumerate(zip(plan.chunks, tokens)):
                req = chunk.request
                if req.status is Status.FINISHED:
                    continue
                self._computed(chunk, output, i, t, events)
                rec = self.records[req.request_id]
                self._append(rec, token, t, events)
                self._emit(rec, token, None, t, events)

    def _computed(self, chunk: Any, output: StepOutput, i: int, t: float, events: list) -> None:
        """Chunk i's tokens are computed: count them, key newly full blocks, keep any prompt logprobs."""
        req = chunk.request
        req.num_computed_tokens += chunk.num_new_tokens
        self.kv.commit(req)
        if req.params.prompt_logprobs is not None:
            self._note_prompt_logprobs(req, output, i, t, events)

    def _pool(self, rec: RequestRecord, chunk: Any, output: StepOutput, i: int, t: float, events: list) -> None:
        """A pooling request's chunk is computed: keep its hidden-state rows; at the prompt's end pool them,
        publish the vector (`Pooled`) and finish ("stop")."""
        req = rec.request
        rows = output.pooled.get(i) if output.pooled is not None else None
        if rows is not None:
            start = req.num_computed_tokens - chunk.num_new_tokens
            for s in [s for s in req.pooled if s >= start]:   # a recompute (after preemption) replaces them
                del req.pooled[s]
            req.pooled[start] = rows
        if req.num_computed_tokens < req.num_prompt_tokens:
            return
        assert self.pooler is not None   # the entry pipeline admits pooling requests only with a pooler
        try:
            parts = [req.pooled[s] for s in sorted(req.pooled)]
            vector = self.pooler.pool(parts, req.prompt_token_ids, req.pooling)
        except Exception as e:
            log.exception("pooling %s failed", req.request_id)
            self._fail(req, type(e).__name__, str(e), events)
            return
        req.pooled = {}
        rec.first_token = rec.last_token = t
        events.append(Pooled(request_id=req.request_id, task_id=req.task_id, ts=t, embedding=tuple(vector),
                             num_prompt_tokens=req.num_prompt_tokens))
        self._finish(rec, rec.output.close("stop"), t, events)

    def _append(self, rec: RequestRecord, token: int, t: float, events: list) -> None:
        """A sampled token joins its request (the next step's input); the first one ends the prefill."""
        req = rec.request
        req.all_token_ids.append(token)
        if rec.first_token is None:
            rec.first_token = t
            events.append(PrefillDone(request_id=req.request_id, task_id=req.task_id, ts=t, first_token_id=token))
        rec.last_token = t

    def _emit(self, rec: RequestRecord, token: int, logprobs: Any, t: float, events: list) -> bool:
        """One appended token through the request's output stage: its TokensEmitted, any complete
        calls, and its end when the stage stops it (True then)."""
        req = rec.request
        out = rec.output.on_token(req, token, self.window, logprobs)
        events.append(TokensEmitted(request_id=req.request_id, task_id=req.task_id, ts=t, token_ids=(token,),
                                    text=out.text, logprobs=out.logprobs, tool_calls=out.tool_calls,
                                    reasoning=out.reasoning, reasoning_tokens=out.reasoning_tokens))
        if out.calls:
            self._requested(rec, out, events)
        if out.reason is None:
            return False
        self._finish(rec, out, t, events, emitted=True)
        return True

    def _apply_draft(self, chunk: Any, tokens: list[int], t: float, events: list) -> None:
        """A verified draft: append the accepted drafts and the one more token (stopping where the
        output stage stops), keep the K/V of the known token and the accepted drafts, roll back the rest."""
        req = chunk.request
        if req.status is Status.FINISHED:
            return
        rec = self.records[req.request_id]
        self.speculator.verified(req, len(chunk.draft), len(tokens) - 1)
        rec.last_token = t
        for token in tokens:
            req.all_token_ids.append(token)
            if self._emit(rec, token, None, t, events):
                return
        # NOTE: the K/V written for the known token and every accepted draft is what the model would
        # have written one token at a time; the last token appended is the only one not computed.
        req.num_computed_tokens = req.num_tokens - 1
        trim = getattr(self.kv, "trim", None)
        if trim is not None:
            trim(req)
        self.kv.commit(req)

    def _note_prompt_logprobs(self, req: Request, output: StepOutput, i: int, t: float, events: list) -> None:
        """Keep the chunk's prompt logprobs; once the prompt is computed, send them all (once)."""
        if output.prompt_logprobs is not None and output.prompt_logprobs[i]:
            req.prompt_logprobs.extend(output.prompt_logprobs[i])
            req.prompt_ranks.extend(output.prompt_ranks[i] if output.prompt_ranks is not None else ())
        if not req.prompt_logprobs_sent and req.num_computed_tokens >= req.num_prompt_tokens:
            req.prompt_logprobs_sent = True
            events.append(PromptLogprobs(request_id=req.request_id, task_id=req.task_id, ts=t,
                                         logprobs=(None, *req.prompt_logprobs), ranks=(0, *req.prompt_ranks)))

    def _requested(self, rec: RequestRecord, out: Released, events: list) -> None:
        tools = rec.output.tools
        if tools is not None:
            tools.requested(out.calls, events)

    def _finish(self, rec: RequestRecord, out: Released, t: float, events: list, emitted: bool = False) -> None:
        """End `rec` with what its output stage released last (`emitted`: already in a TokensEmitted)."""
        req = rec.request
        if not emitted:
            if not out.empty:
                events.append(TokensEmitted(request_id=req.request_id, task_id=req.task_id, ts=t, token_ids=(),
                                            text=out.text, logprobs=out.logprobs, tool_calls=out.tool_calls,
                                            reasoning=out.reasoning))
            if out.calls:
                self._requested(rec, out, events)
        req.finish_reason, req.stop_reason = out.reason or "abort", out.stop_reason
        self.forwards.release(req)   # its blocks may be read by the running forward: freed once it is done
        req.status = Status.FINISHED
        del self.records[req.request_id]
        drafted = accepted = 0
        if self.speculator is not None:
            self.speculator.finished(req)
            drafted, accepted = self.speculator.acceptance(req)
        events.append(rec.finished(t, drafted, accepted))

    def _fail(self, req: Request, error_type: str, message: str, events: list) -> None:
        rec = self.records.pop(req.request_id, None)
        if rec is None:
            return
        self.scheduler.finish(req)
        req.status = Status.FINISHED
        req.finish_reason = "error"
        events.append(RequestFailed(request_id=req.request_id, task_id=req.task_id, error_type=error_type,
                                    message=message))
