"""`RedisQuotaStore`: the `QuotaStore` every replica and front end shares, in one Redis.

Each reservation and settlement is one Lua script, which Redis runs atomically: no other
process's script interleaves between the check and the charge, so the sum over all processes
never exceeds a key's limits. The clock is Redis's own (`TIME`), so processes on several
machines refill the same buckets at the same rate.

    modelcall:quota:{key}:rpm        hash level, ts   requests left in the minute bucket
    modelcall:quota:{key}:tpm        hash level, ts   tokens left in the minute bucket
    modelcall:quota:{key}:day:{day}  integer          tokens reserved or spent this UTC day (expires after 2 days)

A bucket left alone for a minute is full again, so it expires then (a missing bucket is full).
Run Redis with an append-only file (`appendonly yes`) for the counters to survive its restart.
"""
from __future__ import annotations

from typing import Any

from modelcall.core.quota_store import QuotaLimits, Refusal, StoreUnavailable

# NOTE: numbers cross into Redis as strings formatted here ('%.6f'): a Lua number handed to
# redis.call or returned is truncated to an integer, which would lose fractions of a request.
_PRELUDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function level(key, cap)
  local v = redis.call('HMGET', key, 'level', 'ts')
  local lvl, ts = tonumber(v[1]), tonumber(v[2])
  if lvl == nil or ts == nil then return cap end
  return math.min(cap, lvl + math.max(0, now - ts) * cap / 60)
end
local function put(key, lvl)
  redis.call('HSET', key, 'level', string.format('%.6f', lvl), 'ts', string.format('%.6f', now))
  redis.call('EXPIRE', key, 61)
end
local rpm, tpm, daily = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
"""

# KEYS: rpm bucket, tpm bucket, day counter. ARGV: rpm, tpm, daily (0: no limit), tokens, day ttl.
# Returns {} when reserved, else {limit, available, retry_after} (strings).
RESERVE = _PRELUDE + """
local need = tonumber(ARGV[4])
local r, k
if rpm > 0 then
  r = level(KEYS[1], rpm)
  if r < 1 then return {'rpm', string.format('%.6f', r), string.format('%.6f', (1 - r) * 60 / rpm)} end
end
if tpm > 0 then
  k = level(KEYS[2], tpm)
  if k < need then return {'tpm', string.format('%.6f', k), string.format('%.6f', (need - k) * 60 / tpm)} end
end
if daily > 0 then
  local used = tonumber(redis.call('GET', KEYS[3]) or '0')
  if used + need > daily then return {'daily_tokens', tostring(daily - used), '0'} end
end
if rpm > 0 then put(KEYS[1], r - 1) end
if tpm > 0 then put(KEYS[2], k - need) end
if daily > 0 then
  redis.call('INCRBY', KEYS[3], need)
  redis.call('EXPIRE', KEYS[3], tonumber(ARGV[5]))
end
return {}
"""

# KEYS as above. ARGV: rpm, tpm, daily, refund tokens, refund request (0/1).
SETTLE = _PRELUDE + """
local refund, again = tonumber(ARGV[4]), tonumber(ARGV[5])
if tpm > 0 and refund > 0 then put(KEYS[2], math.min(tpm, level(KEYS[2], tpm) + refund)) end
if daily > 0 and refund > 0 then
  local used = tonumber(redis.call('GET', KEYS[3]) or '-1')
  if used >= 0 then redis.call('SET', KEYS[3], tostring(math.max(0, used - refund)), 'KEEPTTL') end
end
if rpm > 0 and again == 1 then put(KEYS[1], math.min(rpm, level(KEYS[1], rpm) + 1)) end
return {}
"""

# KEYS as above. ARGV: rpm, tpm. Returns {requests left, tokens left} without changing them.
USAGE = _PRELUDE + """
local r, k = -1, -1
if rpm > 0 then r = level(KEYS[1], rpm) end
if tpm > 0 then k = level(KEYS[2], tpm) end
return {string.format('%.6f', r), string.format('%.6f', k), redis.call('GET', KEYS[3]) or '0'}
"""

DAY_TTL_S = 2 * 86400


class RedisQuotaStore:
    """A `QuotaStore` in the Redis at `url` (`redis://host:port/db`). `timeout_s` bounds every call:
    the meter calls `reserve` on the event loop, so a Redis that hangs must not hang admission."""

    def __init__(self, url: str, *, timeout_s: float = 0.5, prefix: str = "modelcall:quota:") -> None:
        try:
            import redis
        except ImportError as e:  # the redis extra
            raise RuntimeError("--quota-store redis://... needs the Redis client: pip install 'modelcall[redis]'") from e
        self.url = url
        self.prefix = prefix
        self._errors: tuple[type[BaseException], ...] = (redis.exceptions.ConnectionError,
                                                        redis.exceptions.TimeoutError, OSError)
        self._client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                            retry_on_timeout=False)
        # register_script: EVALSHA, and EVAL again after a restarted Redis forgot the script (NOSCRIPT).
        self._reserve = self._client.register_script(RESERVE)
        self._settle = self._client.register_script(SETTLE)
        self._usage = self._client.register_script(USAGE)

    def _keys(self, key: str, day: str) -> list[str]:
        base = f"{self.prefix}{key}:"
        return [base + "rpm", base + "tpm", f"{base}day:{day}"]

    @staticmethod
    def _limits(limits: QuotaLimits) -> list[int]:
        return [limits.rpm or 0, limits.tpm or 0, limits.daily_tokens or 0]

    def _call(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        try:
            return script(keys=keys, args=args)
        except self._errors as e:
            raise StoreUnavailable(f"{type(e).__name__}: {e}") from e

    def ping(self) -> bool:
        try:
            return bool(self._client.ping())
        except self._errors:
            return False

    def reserve(self, key: str, limits: QuotaLimits, tokens: int, day: str) -> Refusal | None:
        out = self._call(self._reserve, self._keys(key, day), [*self._limits(limits), tokens, DAY_TTL_S])
        if not out:
            return None
        limit, available, retry = (x.decode() if isinstance(x, bytes) else str(x) for x in out)
        return Refusal(limit=limit, available=float(available), retry_after=float(retry))

    def settle(self, key: str, limits: QuotaLimits, refund_tokens: int, day: str, refund_request: bool) -> None:
        self._call(self._settle, self._keys(key, day),
                   [*self._limits(limits), max(0, refund_tokens), 1 if refund_request else 0])

    def usage(self, key: str, limits: QuotaLimits, day: str) -> dict[str, float]:
        r, k, used = self._call(self._usage, self._keys(key, day), self._limits(limits))
        return {"requests_left": float(r), "tokens_left": float(k), "tokens_today": float(used)}

    def close(self) -> None:
        self._client.close()
