"""Sampling parameters of one request, validated at construction with errors that name the field."""
from __future__ import annotations

import msgspec

from modelcall.core.errors import InvalidRequest


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How to pick tokens and when to stop.

    `max_tokens=None` means: up to the context window. `top_k=0` and `top_p=1.0` disable those
    filters; `temperature=0` is greedy. `logprobs=N` returns the sampled token's log-probability
    and the N most likely alternatives at each position.
    """

    max_tokens: int | None = None
    min_tokens: int = 0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None
    # Log-probability of every prompt token but the first (which has no context) and the N most
    # likely alternatives there, computed in the prefill forward itself (vLLM's `prompt_logprobs`).
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        # NOTE: max_tokens 0 scores the prompt without generating; only meaningful with prompt logprobs.
        _check(self.max_tokens is None or self.max_tokens >= 1 or (self.max_tokens == 0 and self.prompt_logprobs is not None),
               "max_tokens", f"must be at least 1 (0 only with prompt_logprobs, to score a prompt), got {self.max_tokens}")
        _check(self.min_tokens >= 0, "min_tokens", f"must be >= 0, got {self.min_tokens}")
        _check(self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens",
               f"{self.min_tokens} exceeds max_tokens {self.max_tokens}")
        _check(0.0 <= self.temperature <= 100.0, "temperature", f"must be in [0, 100], got {self.temperature}")
        _check(self.top_k >= 0 or self.top_k == -1, "top_k", f"must be >= 0 (0 or -1 disables), got {self.top_k}")
        _check(0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p}")
        _check(0.0 <= self.min_p <= 1.0, "min_p", f"must be in [0, 1], got {self.min_p}")
        _check(self.repetition_penalty > 0.0, "repetition_penalty", f"must be > 0, got {self.repetition_penalty}")
        _check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", f"must be in [-2, 2], got {self.presence_penalty}")
        _check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", f"must be in [-2, 2], got {self.frequency_penalty}")
        _check(all(isinstance(s, str) and s for s in self.stop), "stop", "stop strings must be non-empty strings")
        _check(len(self.stop) <= 16, "stop", f"at most 16 stop strings, got {len(self.stop)}")
        _check(all(t >= 0 for t in self.stop_token_ids), "stop_token_ids", "token ids must be >= 0")
        _check(self.logprobs is None or 0 <= self.logprobs <= 20, "logprobs", f"must be in [0, 20], got {self.logprobs}")
        _check(self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= 20, "prompt_logprobs",
               f"must be in [0, 20], got {self.prompt_logprobs}")
        _check(self.seed is None or 0 <= self.seed < 2**63, "seed", f"must be in [0, 2**63), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @classmethod
    def create(cls, **fields: object) -> SamplingParams:
        """Build from loose input (e.g. JSON): wrong types become InvalidRequest naming the field."""
        fields = {k: v for k, v in fields.items() if v is not None or k == "max_tokens"}
        for k in ("stop", "stop_token_ids"):
            if isinstance(fields.get(k), (str, int)):
                fields[k] = (fields[k],)
        try:
            return msgspec.convert(fields, cls)
        except msgspec.ValidationError as e:
            msg = str(e)
            if "unknown field" in msg:
                name = msg.split("`")[1] if "`" in msg else None
                raise InvalidRequest(f"unknown sampling parameter {name!r}", field=name) from None
            if "$." not in msg:  # a range check of __post_init__: rebuild to get its own error and field
                return cls(**fields)
            field = msg.rsplit("$.", 1)[-1].split("[")[0].rstrip("`")
            raise InvalidRequest(f"invalid {field}: {msg}", field=field) from None

def _check(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise InvalidRequest(f"{field} {message}", field=field)
