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

    @classmethod
    def from_kernel(cls, e: ModelcallError) -> ApiError:
        code = getattr(e, "code", None) or ("context_length_exceeded" if isinstance(e, ContextOverflow) else None)
        return cls(e.status, str(e), error_type=e.error_type, param=getattr(e, "field", None), code=code,
                   retry_after=getattr(e, "retry_after", None))

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
    return {"type": "error", "error": {"type": ANTHROPIC_TYPES.get(e.status, e.error_type), "message": e.message}}


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
