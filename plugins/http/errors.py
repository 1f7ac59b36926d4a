"""HTTP errors in each protocol's own shape: OpenAI `{"error": {...}}`, Anthropic `{"type": "error", ...}`."""
from __future__ import annotations

import re

import msgspec
from aiohttp import web

from modelcall.core.errors import ContextOverflow, ModelcallError

# Anthropic names one error type per status; OpenAI uses `type` loosely and `code` for the detail.
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
                   429: "rate_limit_error", 500: "api_error", 503: "overloaded_error"}


class ApiError(Exception):
    """An error the front end answers with; `param` names the offending field when one is known."""

    def __init__(self, status: int, message: str, *, error_type: str | None = None, param: str | None = None,
                 code: str | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type or ("invalid_request_error" if status < 500 else "internal_error")
        self.param = param
        self.code = code
        self.retry_after = retry_after
        self.anthropic_message: str | None = None  # where Anthropic words the same error its own way

    @classmethod
    def from_kernel(cls, e: ModelcallError) -> ApiError:
        code = getattr(e, "code", None) or ("context_length_exceeded" if isinstance(e, ContextOverflow) else None)
        err = cls(e.status, str(e), error_type=e.error_type, param=getattr(e, "field", None), code=code,
                  retry_after=getattr(e, "retry_after", None))
        if isinstance(e, ContextOverflow):
            err.anthropic_message = anthropic_overflow(e)
        return err

    @classmethod
    def from_decode(cls, e: msgspec.DecodeError | msgspec.ValidationError) -> ApiError:
        """A body msgspec refused: name the JSON path it points at (`$.messages[0].role` → messages[0].role)."""
        msg = str(e)
        m = re.search(r"at `\$\.?([^`]*)`", msg)
        param = m.group(1) or None if m else None
        kind = "invalid field" if isinstance(e, msgspec.ValidationError) else "malformed JSON body"
        return cls(400, f"{kind}: {msg}", param=param, code="invalid_value" if param else "invalid_json")


def openai_body(e: ApiError) -> dict:
    return {"error": {"message": e.message, "type": e.error_type, "param": e.param, "code": e.code}}


def anthropic_body(e: ApiError) -> dict:
    return {"type": "error", "error": {"type": ANTHROPIC_TYPES.get(e.status, e.error_type),
                                       "message": e.anthropic_message or e.message}}


def anthropic_overflow(e: ContextOverflow) -> str:
    """Anthropic's two wordings of an overflow: clients (LiteLLM's anthropic provider, Claude Code) classify
    it by "prompt is too long" / "exceed context limit", as they do with Anthropic's API."""
    parts = "".join(f", {k}: {v}" for k, v in e.breakdown.items())
    if e.prompt_tokens >= e.window:
        head = f"prompt is too long: {e.prompt_tokens} tokens > {e.window} maximum"
    else:
        head = (f"input length and `max_tokens` exceed context limit: {e.prompt_tokens} + {e.max_tokens} > "
                f"{e.window}, decrease input length or `max_tokens` and try again")
    return head + (f" (prompt tokens by part{parts})" if parts else "")


def is_anthropic(path: str) -> bool:
    return path.startswith("/v1/messages")


def error_response(e: ApiError, path: str) -> web.Response:
    """The error as the protocol of `path` spells it, with Retry-After when there is one."""
    body = anthropic_body(e) if is_anthropic(path) else openai_body(e)
    headers = {}
    if e.retry_after is not None:
        headers["Retry-After"] = str(max(1, round(e.retry_after)))
    return web.Response(status=e.status, body=msgspec.json.encode(body), content_type="application/json",
                        headers=headers)


def sse_error_payload(e: ApiError, anthropic: bool) -> bytes:
    """The error as one SSE frame, for failures after the stream has begun."""
    if anthropic:
        return b"event: error\ndata: " + msgspec.json.encode(anthropic_body(e)) + b"\n\n"
    return b"data: " + msgspec.json.encode(openai_body(e)) + b"\n\n"
