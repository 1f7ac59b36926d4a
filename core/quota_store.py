"""Quota state that several processes share: the protocol a quota meter charges through.

One process keeps its counters in memory; several (replicas, front ends behind a load balancer)
must keep them in one place, or a key's limit becomes N times its limit. A `QuotaStore` holds,
per key, a token bucket of requests per minute, a token bucket of tokens per minute and the
tokens spent this UTC day, and changes them only atomically: a reservation either fits every
limit and is taken from all of them, or changes nothing.

The meter reserves a request's worst case at admission, settles it at its end (charging the real
count, giving the rest back) and releases it when the request never ran. A store that cannot be
reached raises `StoreUnavailable`; what happens then (refuse with 503, or count locally) is the
meter's configured behaviour, not the store's.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import msgspec


class StoreUnavailable(Exception):
    """The store did not answer (refused, timed out, still loading). Nothing was changed that the
    caller can rely on."""


class QuotaLimits(msgspec.Struct, frozen=True, kw_only=True):
    """A key's limits as the store applies them; None: no limit of that kind."""

    rpm: int | None = None            # requests per minute: a bucket of rpm, refilled at rpm/60 a second
    tpm: int | None = None            # tokens per minute: a bucket of tpm, refilled at tpm/60 a second
    daily_tokens: int | None = None   # tokens per UTC day

    @property
    def any(self) -> bool:
        return self.rpm is not None or self.tpm is not None or self.daily_tokens is not None


class Refusal(msgspec.Struct, frozen=True, kw_only=True):
    """Why a reservation did not fit: which limit ("rpm", "tpm", "daily_tokens"), what is left of it
    now, and the seconds until the reservation would fit (0 for the daily budget: the next UTC day)."""

    limit: str
    available: float
    retry_after: float


@runtime_checkable
class QuotaStore(Protocol):
    """Per-key quota counters, changed atomically (across processes when the store is shared).

    `key` names the caller (its key name); `day` is the UTC date (YYYY-MM-DD) the caller charges
    its daily tokens to, so every process agrees on when a day ends.
    """

    def reserve(self, key: str, limits: QuotaLimits, tokens: int, day: str) -> Refusal | None:
        """Take one request and `tokens` tokens from `key`'s counters if every limit allows it
        (None), else change nothing and say which limit refused (a `Refusal`). Raises
        `StoreUnavailable` when the store cannot be reached."""
        ...

    def settle(self, key: str, limits: QuotaLimits, refund_tokens: int, day: str, refund_request: bool) -> None:
        """Give back `refund_tokens` of a reservation (reserved minus used; all of it on abort) and,
        when `refund_request`, the request itself (it was refused later and never ran). Never
        refills past a limit. Raises `StoreUnavailable` when the store cannot be reached."""
        ...

    def usage(self, key: str, limits: QuotaLimits, day: str) -> dict[str, float]:
        """What is left now: `requests_left`, `tokens_left` (per minute) and `tokens_today` (spent)."""
        ...
