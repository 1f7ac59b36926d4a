"""Errors of the kernel. Each carries the HTTP status a front end answers with and a type name."""
from __future__ import annotations


class ModelcallError(Exception):
    status = 500
    error_type = "internal_error"


class InvalidRequest(ModelcallError, ValueError):
    """The request is malformed: `field` names what was wrong."""

    status = 400
    error_type = "invalid_request_error"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ContextOverflow(InvalidRequest):
    """Prompt plus requested output does not fit the model's context window."""

    def __init__(self, prompt_tokens: int, max_tokens: int, window: int, breakdown: dict[str, int] | None = None) -> None:
        self.prompt_tokens, self.max_tokens, self.window = prompt_tokens, max_tokens, window
        self.breakdown = breakdown or {}
        detail = "".join(f", {k}: {v}" for k, v in self.breakdown.items())
        # NOTE: clients classify an overflow by the message, not every one reads the error code: the first sentence is
        # OpenAI's (and vLLM's) wording (LiteLLM's ContextWindowExceededError, pydantic-ai), and the code's name is in
        # the text (LangChain looks for it there; the openai SDK's exception text is the message alone).
        super().__init__(
            f"This model's maximum context length is {window} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the completion). "
            f"The context window is {window} tokens; the prompt has {prompt_tokens} tokens{detail} and "
            f"{max_tokens} output tokens were requested. Shorten the prompt or lower max_tokens "
            "(context_length_exceeded).", field="messages")


class ContentBlocked(InvalidRequest):
    """A safety filter refused the prompt; `filter` names it and the message gives its reason."""

    code = "content_filter"

    def __init__(self, filter_name: str, reason: str) -> None:
        self.filter = filter_name
        super().__init__(f"the prompt was blocked by the {filter_name} filter: {reason}", field="messages")


class Unauthenticated(ModelcallError):
    """No valid API key was presented (the key itself is never echoed)."""

    status = 401
    error_type = "authentication_error"


class PermissionDenied(ModelcallError):
    """The caller is authenticated but may not use this model or tool."""

    status = 403
    error_type = "permission_error"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ModelNotFound(ModelcallError):
    status = 404
    error_type = "not_found_error"

    def __init__(self, message: str, field: str | None = "model") -> None:
        super().__init__(message)
        self.field = field


class Overloaded(ModelcallError):
    """Admission refused: too many requests waiting. Retry after `retry_after` seconds."""

    status = 429
    error_type = "rate_limit_error"

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Unavailable(ModelcallError):
    """The kernel is not accepting work (starting, draining or stopped)."""

    status = 503
    error_type = "overloaded_error"

    def __init__(self, message: str, retry_after: float = 5.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PluginError(ModelcallError):
    """A plugin failed while the kernel assembled or ran it; names the plugin and the hook."""

    error_type = "plugin_error"

    def __init__(self, plugin: str, hook: str, cause: BaseException | str) -> None:
        self.plugin, self.hook = plugin, hook
        why = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
        super().__init__(f"plugin {plugin!r} failed in hook {hook}: {why}")


class ConfigError(ModelcallError, ValueError):
    error_type = "config_error"
